"""Clocks for the simulated backend.

The backend "runs" a step by waiting on its clock until the step's modelled end. With the real clock that is
a sleep (the backend runs in a worker thread, so the event loop keeps going), which makes service tests see
realistic latencies. With the virtual clock it is an instant jump, so a simulation of minutes of serving
finishes in the time the scheduler itself needs, while every timestamp read from the clock is simulated time.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from backends import base


class Clock(base.Clock, Protocol):
    """A clock the simulated step can also wait on."""

    def sleep_until(self, deadline: float) -> None: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time (monotonic); waiting sleeps."""

    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now() + seconds)


class VirtualClock:
    """Simulated time: it moves only when someone waits on it, and then instantly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()  # the engine's thread reads while the worker thread advances

    def now(self) -> float:
        return self._now

    def sleep_until(self, deadline: float) -> None:
        with self._lock:
            self._now = max(self._now, deadline)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self._now += max(seconds, 0.0)


CLOCKS = {"real": RealClock, "virtual": VirtualClock}


def make_clock(name: str) -> Clock:
    if name not in CLOCKS:
        raise ValueError(f"unknown sim clock '{name}' (choose from {', '.join(CLOCKS)})")
    clock: Clock = CLOCKS[name]()
    return clock
