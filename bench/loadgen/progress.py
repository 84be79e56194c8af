"""A one-line progress display on stderr, redrawn at most a few times a second."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

BAR_WIDTH = 30


class Progress(Protocol):
    def started(self, label: str, total: int | None, duration_s: float | None) -> None: ...

    def update(self, done: int, errors: int) -> None: ...

    def finished(self) -> None: ...


class NoProgress:
    def started(self, label: str, total: int | None, duration_s: float | None) -> None:
        pass

    def update(self, done: int, errors: int) -> None:
        pass

    def finished(self) -> None:
        pass


class LineProgress:
    """`[#####.....] 120/400 requests  6.1/30 s  2 errors  rate 19.7/s`, rewritten in place."""

    def __init__(self, stream: TextIO = sys.stderr, interval_s: float | None = None) -> None:
        self.stream = stream
        self.in_place = stream.isatty()  # a log file gets a fresh line every few seconds instead
        self.interval_s = interval_s if interval_s is not None else (0.25 if self.in_place else 5.0)
        self.label = ""
        self.total: int | None = None
        self.duration_s: float | None = None
        self.t0 = self.last_draw = 0.0
        self.done = self.errors = 0

    def started(self, label: str, total: int | None, duration_s: float | None) -> None:
        self.label, self.total, self.duration_s = label, total, duration_s
        self.t0, self.last_draw, self.done, self.errors = time.monotonic(), 0.0, 0, 0
        self._draw(time.monotonic())

    def update(self, done: int, errors: int) -> None:
        self.done, self.errors = done, errors
        now = time.monotonic()
        if now - self.last_draw >= self.interval_s:
            self._draw(now)

    def finished(self) -> None:
        self._draw(time.monotonic())
        if self.in_place:
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, now: float) -> None:
        self.last_draw = now
        line = self.line(now - self.t0)
        self.stream.write("\r" + line if self.in_place else line + "\n")
        self.stream.flush()

    def line(self, elapsed: float) -> str:
        fraction = self._fraction(elapsed)
        bar = "#" * round(fraction * BAR_WIDTH)
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        clock = f"{elapsed:.1f}/{self.duration_s:g} s" if self.duration_s else f"{elapsed:.1f} s"
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (f"{self.label}: [{bar:<{BAR_WIDTH}}] {count} requests  {clock}  {self.errors} errors  "
                f"{rate:.1f} req/s ")

    def _fraction(self, elapsed: float) -> float:
        parts: list[float] = []
        if self.total:
            parts.append(self.done / self.total)
        if self.duration_s:
            parts.append(elapsed / self.duration_s)
        return min(1.0, max(parts, default=0.0))
