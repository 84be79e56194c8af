"""Open-loop arrivals: gaps between sessions drawn from a gamma distribution with mean 1/rate.

Shape k = burstiness, scale 1/(rate k) (vLLM's convention): k = 1 is the exponential, i.e. a Poisson process;
k < 1 gives the same mean rate in bursts (coefficient of variation 1/sqrt(k) > 1); k > 1 is more regular than
Poisson. An infinite rate sends everything at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator


def gaps(rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless seconds between consecutive arrivals (the first arrival comes after the first gap)."""
    if math.isinf(rate):
        while True:
            yield 0.0
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


def arrival_times(rate: float, burstiness: float = 1.0, seed: int = 0) -> Iterator[float]:
    """Endless arrival times in seconds from the start; the first is at 0."""
    t = 0.0
    for gap in gaps(rate, burstiness, seed):
        yield t
        t += gap
