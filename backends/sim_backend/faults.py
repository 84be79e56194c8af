"""Fault injection for the sim backend: failures on chosen steps, for tests and drills.

A spec is a comma-separated list of `KIND@STEP` (on the backend's STEP-th step, counting from 1) or
`KIND%PERCENT` (on each step with that probability, from a generator seeded by `sim_seed`). Kinds:

  step_error            the step raises
  bad_token             one sampled row gets a token id outside the vocabulary
  slow_step:SECONDS     the step takes SECONDS longer (on the backend's clock)
  hang[:SECONDS]        the step blocks, in real time (for SECONDS, or until the injector is released)
  poison@SEQUENCE       every step that carries sequence SEQUENCE raises: a request whose input the backend
                        cannot take (sequence ids count from 0 in arrival order, one per choice, so with n = 1
                        SEQUENCE is the index of the request)

Example: `step_error@3,bad_token%5,hang@100,poison@7`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np

KINDS = ("step_error", "bad_token", "slow_step", "hang", "poison")
_NUMBER = r"\d+(?:\.\d*)?"
_ITEM = re.compile(rf"^(?P<kind>[a-z_]+)(?::(?P<seconds>{_NUMBER}))?(?:@(?P<step>\d+)|%(?P<percent>{_NUMBER}))$")


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the item."""


class InjectedFault(RuntimeError):
    """What a `step_error` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int | None = None  # fires on this step only
    percent: float | None = None  # or on each step with this probability
    seconds: float | None = None  # slow_step's delay; hang's bound (None: until released)
    sequence: int | None = None  # poison's sequence id


def parse_faults(spec: str) -> tuple[Fault, ...]:
    return tuple(_parse_item(item.strip()) for item in spec.split(",") if item.strip())


def _parse_item(item: str) -> Fault:
    found = _ITEM.match(item)
    if found is None or found["kind"] not in KINDS:
        raise FaultSpecError(f"sim fault {item!r}: expected KIND@STEP or KIND%PERCENT with KIND one of "
                             f"{', '.join(KINDS)} (slow_step:SECONDS, hang[:SECONDS])")
    kind, seconds = found["kind"], _float(found["seconds"])
    if (kind == "slow_step" and seconds is None) or (kind in ("step_error", "bad_token", "poison") and
                                                      seconds is not None):
        raise FaultSpecError(f"sim fault {item!r}: only slow_step and hang take :SECONDS, and slow_step needs it")
    step, percent = found["step"], _float(found["percent"])
    if kind == "poison":
        if step is None:
            raise FaultSpecError(f"sim fault {item!r}: poison takes @SEQUENCE, the sequence id it fails on")
        return Fault(kind, sequence=int(step))
    if (step is not None and int(step) < 1) or (percent is not None and not 0 < percent <= 100):
        raise FaultSpecError(f"sim fault {item!r}: STEP counts from 1, PERCENT is in (0, 100]")
    return Fault(kind, int(step) if step is not None else None, percent, seconds)


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


class FaultInjector:
    """Decides which faults fire on each step, and carries out the ones that only cost time."""

    def __init__(self, faults: tuple[Fault, ...], seed: int = 0) -> None:
        self.faults = faults
        self._rng = np.random.default_rng([seed, 0xFA17])
        self._released = threading.Event()
        self.steps = 0

    def next_step(self) -> tuple[Fault, ...]:
        """Count a step; the faults that fire on it (a percent fault draws once per step)."""
        self.steps += 1
        return tuple(f for f in self.faults if self._fires(f))

    def poisoned(self, seq_ids: tuple[int, ...]) -> int | None:
        """The poisoned sequence a step carries, if any."""
        poisons = {f.sequence for f in self.faults if f.kind == "poison"}
        return next((s for s in seq_ids if s in poisons), None)

    def _fires(self, fault: Fault) -> bool:
        if fault.kind == "poison":
            return False  # not by step: `poisoned` looks at the step's sequences
        if fault.step is not None:
            return fault.step == self.steps
        return bool(self._rng.random() * 100 < (fault.percent or 0.0))

    def pick_row(self, num_rows: int) -> int:
        return int(self._rng.integers(num_rows))

    def hang(self, fault: Fault) -> None:
        self._released.wait(fault.seconds)

    def release(self) -> None:
        """Let every hung step go on (tests end their servers with this)."""
        self._released.set()
