"""The bits of the Prometheus text exposition format a benchmark reads: histograms (summed over label sets)
and plain gauge values, plus histogram_quantile's estimate of a quantile from the buckets."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]*)"')


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts: `counts[i]` observations <= `bounds[i]`; the last bound is +Inf."""

    name: str
    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float  # the _sum

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (the same histogram scraped before)."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True))
        return Histogram(self.name, self.bounds, counts, self.total - earlier.total)

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear inside the bucket holding rank q * count; the highest finite
        bound when that bucket is +Inf; NaN without observations."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        for i, (bound, cumulative) in enumerate(zip(self.bounds, self.counts, strict=True)):
            if cumulative >= rank:
                if math.isinf(bound):
                    return self.bounds[-2] if len(self.bounds) > 1 else math.nan
                lower, below = (self.bounds[i - 1], self.counts[i - 1]) if i else (0.0, 0.0)
                in_bucket = cumulative - below
                return lower + (bound - lower) * ((rank - below) / in_bucket if in_bucket else 1.0)
        return math.nan

    def fraction_at_most(self, bound_index: int) -> float:
        return self.counts[bound_index] / self.count if self.count else math.nan


def parse_histograms(text: str) -> dict[str, Histogram]:
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[str, float] = defaultdict(float)
    for name, labels, value in _samples(text):
        if name.endswith("_bucket"):
            le = _LE.search(labels)
            if le is not None:
                buckets[name[:-7]][float(le.group(1))] += value
        elif name.endswith("_sum"):
            sums[name[:-4]] += value
    out = {}
    for base, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        out[base] = Histogram(base, bounds, tuple(by_bound[b] for b in bounds), sums.get(base, 0.0))
    return out


def gauge_values(text: str) -> dict[str, float]:
    """Every unlabelled sample, and each labelled one summed under its bare name."""
    values: dict[str, float] = defaultdict(float)
    for name, _, value in _samples(text):
        values[name] += value
    return dict(values)


def _samples(text: str) -> list[tuple[str, str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = _SAMPLE.match(line)
        if match is not None:
            try:
                out.append((match.group(1), match.group(2) or "", float(match.group(3))))
            except ValueError:
                continue
    return out


def find(histograms: dict[str, Histogram], suffix: str) -> Histogram | None:
    """The histogram whose name ends with `suffix`, whatever the server's prefix (`pagedserve:`, `vllm:`)."""
    matches = [h for name, h in histograms.items() if name.endswith(suffix)]
    return matches[0] if len(matches) == 1 else None
