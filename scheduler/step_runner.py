"""Runs the backend's steps off the event loop, in one thread of their own, under a watchdog (and other work that
must run there, beside no step: a draft model's proposals).

The thread is a daemon: a step that never returns can be abandoned (the engine declares itself failed and the
process exits) without the interpreter waiting on it at exit, which a ThreadPoolExecutor worker would make it do.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from backends.base import StepBatch, StepOutput

Execute = Callable[[StepBatch], StepOutput]
T = TypeVar("T")


class StepTimeoutError(Exception):
    """The step did not finish within the watchdog's limit: the backend is presumed hung."""


class StepCrashedError(Exception):
    """The step raised something that is not an ordinary Exception (SystemExit, KeyboardInterrupt, ...)."""


@dataclass
class _Job:
    work: Callable[[], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop

    def deliver(self, output: Any, error: Exception | None) -> None:
        """Settle the future on its loop, unless the engine gave up on it (watchdog, shutdown)."""
        def apply() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(output)

        try:
            self.loop.call_soon_threadsafe(apply)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


class StepRunner:
    def __init__(self, execute: Execute, *, inline: bool = False, timeout_s: float = 0.0) -> None:
        """inline: run on the caller's thread (for steps that cost nothing); timeout_s 0: no watchdog."""
        self._execute = execute
        self._inline = inline
        self._timeout = timeout_s or None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, batch: StepBatch) -> StepOutput:
        return await self.call(partial(self._execute, batch))

    async def call(self, work: Callable[[], T]) -> T:
        """`work()` in the step thread (on the caller's with inline), under the same watchdog as a step."""
        if self._inline:
            return self._call(work)
        future: asyncio.Future[T] = self._submit(work)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._timeout)
        except TimeoutError:
            raise StepTimeoutError(f"the backend's step did not finish within {self._timeout:g} s") from None

    def close(self) -> None:
        """Let the thread end after its current step; never waits for it (it may be hung)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _call(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except Exception:
            raise
        except BaseException as exc:  # not for the event loop to meet: it would stop the loop itself
            raise StepCrashedError(f"the step raised {type(exc).__name__}: {exc}") from exc

    def _submit(self, work: Callable[[], Any]) -> asyncio.Future[Any]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="pagedserve-step", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._jobs.put(_Job(work, future, loop))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.deliver(self._call(job.work), None)
            except Exception as exc:  # noqa: BLE001 - handed to the engine, which decides
                job.deliver(None, exc)
