"""Whether the engine's steps are going well, for /health: a server whose steps mostly fail, or whose step has
run far past its predicted time, should leave a load balancer's rotation before the engine gives up on it.

It only reports. What the engine cannot go on from (a step past the watchdog's limit, failures in a row) still
fails the engine, which exits for its supervisor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_REMEMBERED = 10_000  # steps kept however short they are: the share of failures is over these at most
STALL_MULTIPLE = 10.0  # a step this many times its predicted time (and past the floor) is reported as stalled


@dataclass(frozen=True)
class HealthLimits:
    window_s: float = 30.0  # steps that ended this recently count
    failure_rate: float = 0.5  # this share of them failed (and at least min_failures): degraded
    min_failures: int = 3  # fewer failed steps never degrade, whatever the share
    stall_floor_s: float = 5.0  # a running step is reported stalled only past this, however short its prediction

    def __post_init__(self) -> None:
        if self.window_s <= 0 or not 0 < self.failure_rate <= 1 or self.min_failures < 1 or self.stall_floor_s <= 0:
            raise ValueError("the health window and stall floor must be positive, the failure rate in (0, 1], "
                             "min_failures at least 1")


class StepHealth:
    """Outcomes of the steps that ended within the window, and the step running now. Written by the engine
    task, read by /health on the same event loop."""

    def __init__(self, limits: HealthLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._ended: deque[tuple[float, bool]] = deque(maxlen=MAX_REMEMBERED)  # (when, failed), oldest first
        self._running: tuple[float, float] | None = None  # (started, predicted seconds)

    def running(self, predicted_s: float) -> None:
        """A backend call started, predicted to take predicted_s."""
        self._running = (self._clock(), predicted_s)

    def stopped(self) -> None:
        """The backend call returned or raised."""
        self._running = None

    def outcome(self, failed: bool) -> None:
        """A step ended: it failed (some of its requests failed with it) or it succeeded."""
        self._ended.append((self._clock(), failed))
        self._forget_old()

    def problem(self) -> str | None:
        """Why the engine is degraded now, in a sentence; None while it is sound."""
        return self._stalled() or self._failing()

    def _stalled(self) -> str | None:
        if self._running is None:
            return None
        started, predicted = self._running
        running = self._clock() - started
        if running <= max(self.limits.stall_floor_s, STALL_MULTIPLE * predicted):
            return None
        return f"the running engine step has taken {running:.1f} s (predicted {predicted:.3f} s)"

    def _failing(self) -> str | None:
        self._forget_old()
        failed = sum(1 for _, f in self._ended if f)
        if failed < self.limits.min_failures or failed < self.limits.failure_rate * len(self._ended):
            return None
        return f"{failed} of the {len(self._ended)} engine steps of the last {self.limits.window_s:g} s failed"

    def _forget_old(self) -> None:
        horizon = self._clock() - self.limits.window_s
        while self._ended and self._ended[0][0] < horizon:
            self._ended.popleft()
