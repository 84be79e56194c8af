"""The telemetry worker: one daemon thread that runs, in order, the calls the engine's hooks queued.

The engine thread only puts a tuple on a SimpleQueue (a C-level append); span building, ITL attribution and
metric updates happen here, overlapping the next engine step instead of lengthening it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pagedserve.telemetry")
Call = tuple[Callable[..., None], tuple[Any, ...]]


class Worker:
    def __init__(self, name: str = "pagedserve-telemetry") -> None:
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, fn: Callable[..., None], *args: Any) -> None:
        self._queue.put((fn, args))

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every call queued before this one has run."""
        done = threading.Event()
        self._queue.put((_set, (done,)))
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (call := self._queue.get()) is not None:
            fn, args = call
            try:
                fn(*args)
            except Exception:
                if not self._failed:
                    self._failed = True
                    log.exception("telemetry failed to process an engine event (later failures are not logged)")


def _set(event: threading.Event) -> None:
    event.set()
