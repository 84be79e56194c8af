"""Percentiles for the micro-benchmarks (the load generator has its own, over whole runs)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
