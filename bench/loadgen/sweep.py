"""A sweep: the same workload at several concurrencies or arrival rates, one run each."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bench.loadgen.spec import LoadShape

KINDS = ("concurrency", "rate")


@dataclass(frozen=True)
class Sweep:
    kind: str  # concurrency | rate
    values: tuple[float, ...]

    def shapes(self, base: LoadShape) -> list[LoadShape]:
        if self.kind == "concurrency":
            return [replace(base, concurrency=int(v), rate=None) for v in self.values]
        return [replace(base, rate=v) for v in self.values]

    def labels(self) -> list[str]:
        return [f"{self.kind}={v:g}" for v in self.values]


def parse_sweep(text: str) -> Sweep:
    """`concurrency=1,4,16,64` or `rate=2,4,8,inf`."""
    kind, sep, raw = text.partition("=")
    kind = kind.strip().lower()
    if not sep or kind not in KINDS:
        raise ValueError(f"bad sweep {text!r}: expected concurrency=N,N,... or rate=R,R,...")
    try:
        values = tuple(float(v) for v in raw.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"bad sweep {text!r}: values must be numbers") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"bad sweep {text!r}: values must be positive")
    if kind == "concurrency" and any(math.isinf(v) or v != int(v) for v in values):
        raise ValueError(f"bad sweep {text!r}: concurrencies are whole numbers")
    return Sweep(kind, values)
