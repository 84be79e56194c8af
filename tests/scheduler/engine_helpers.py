"""What the async engine's tests share: a bounded event loop per test, and distinct prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(body: Callable[[], Coroutine[Any, Any, T]], timeout: float = 15.0) -> T:
    """asyncio.run(body()), failing instead of hanging past `timeout`."""
    async def bounded() -> T:
        return await asyncio.wait_for(body(), timeout)

    return asyncio.run(bounded())


def prompt(i: int, length: int = 20) -> tuple[int, ...]:
    """The i-th of many prompts that share no prefix block."""
    return tuple(1000 + (97 * i + 13 * j) % 20000 for j in range(length))
