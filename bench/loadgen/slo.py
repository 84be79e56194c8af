"""Service-level objectives for goodput: `ttft=500ms,tpot=50ms,e2e=10s` (a bare number is milliseconds)."""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
KEYS = ("ttft", "tpot", "e2e")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s)?\s*$")


@dataclass(frozen=True)
class Slo:
    """Upper bounds in seconds; None: not constrained."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met(self, ttft: float | None, tpot: float | None, e2e: float) -> bool:
        """A request with no TTFT (no text) misses a TTFT bound; one with a single token has no TPOT to miss."""
        if self.ttft is not None and (ttft is None or ttft > self.ttft):
            return False
        if self.tpot is not None and tpot is not None and tpot > self.tpot:
            return False
        return self.e2e is None or e2e <= self.e2e

    def text(self) -> str:
        return ",".join(f"{key}={value * 1e3:g}ms" for key in KEYS if (value := getattr(self, key)) is not None)


def parse_slo(text: str) -> Slo:
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        match = _VALUE.match(raw)
        if not sep or key not in KEYS or match is None:
            raise ValueError(f"bad SLO {part!r}: expected KEY=VALUE[us|ms|s] with KEY in {', '.join(KEYS)}")
        values[key] = float(match.group(1)) * UNITS[match.group(2) or "ms"]
    if not values:
        raise ValueError("empty SLO: expected e.g. ttft=500ms,tpot=50ms")
    return Slo(**values)
