"""Blocking start-up work on a thread of its own, which ends with the work.

The NumPy backend's OpenMP kernels keep a team of worker threads for every thread that runs them, for as long
as that thread lives. The step-cost calibration runs backend steps at start-up; run on asyncio's default
executor, its thread (and the team beside it) lived on next to the step thread's team: more OpenMP threads than
cores, and libgomp then throttles its barrier spinning to a few rounds (whatever GOMP_SPINCOUNT says), so every
barrier of every step slept and woke. Under an ITL target, the only setting that calibrates, a 16-row decode
step took 25 % longer (docs/PERFORMANCE.md). A thread that ends takes its team with it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_in_own_thread(fn: Callable[[], T], name: str) -> T:
    """fn() on a new thread, awaited; its exception, if any, raised here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():  # the awaiting task was cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, which raises it
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile (a shutdown during start-up): no one is waiting
            pass

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done
