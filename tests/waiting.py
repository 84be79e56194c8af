"""Waiting in tests for something to happen: poll it until it holds, failing at a deadline, instead of sleeping a
fixed time and hoping. The deadline only bounds a failure: a condition that holds returns at once."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.02


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not reached within {timeout:g} s"
        time.sleep(POLL_S)


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0,
                what: str = "the condition") -> None:
    """wait_until for a coroutine, without blocking its loop; `predicate` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"{what}: not reached within {timeout:g} s"
        await asyncio.sleep(POLL_S)
