"""The bench's own latency samples against the server's Prometheus histograms for the same requests.

The server observes from a request's arrival to its tokens leaving the engine, the client from sending to
receiving, so the client's figures run a little higher (the HTTP round trip and the stream's write). The
histograms' bucket bounds limit what can be compared: a percentile is "consistent" when the bench's value and
the server's estimate fall in the same bucket or in neighbouring ones; `cdf_gap` is the largest difference,
over the bucket bounds, between the share of the bench's samples and of the server's observations at or
under that bound. The bench's ITL is per text chunk, the server's per token: they agree only when each event
carries one token (serve with `--max-stream-events-per-s 0`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.loadgen.metrics import RequestMetrics
from bench.loadgen.promtext import Histogram, find, parse_histograms

METRICS = {  # bench sample -> histogram name suffix
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "tpot": "time_per_output_token_seconds",
    "e2e": "e2e_request_latency_seconds",
}
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class QuantileCheck:
    q: float
    bench_ms: float
    server_ms: float  # histogram_quantile estimate
    consistent: bool  # same or neighbouring bucket


@dataclass(frozen=True)
class MetricCheck:
    metric: str
    histogram: str
    bench_count: int
    server_count: float
    quantiles: tuple[QuantileCheck, ...]
    cdf_gap: float

    @property
    def consistent(self) -> bool:
        return all(q.consistent for q in self.quantiles)


@dataclass(frozen=True)
class CrossCheck:
    checks: tuple[MetricCheck, ...]
    missing: tuple[str, ...]  # metrics the server does not export
    note: str = ""


def bench_samples(ok: Sequence[RequestMetrics]) -> dict[str, list[float]]:
    return {
        "ttft": [m.ttft for m in ok if m.ttft is not None],
        "itl": [g for m in ok for g in m.itls],
        "tpot": [m.tpot for m in ok if m.tpot is not None],
        "e2e": [m.e2e for m in ok],
    }


def cross_check(before: str, after: str, ok: Sequence[RequestMetrics]) -> CrossCheck:
    """Compare the histograms' growth between two /metrics scrapes with the bench's samples."""
    if not after:
        return CrossCheck((), tuple(METRICS), "no /metrics scrape")
    start, end = parse_histograms(before), parse_histograms(after)
    samples = bench_samples(ok)
    checks, missing = [], []
    for metric, suffix in METRICS.items():
        hist = find(end, suffix)
        if hist is None:
            missing.append(metric)
            continue
        checks.append(compare(metric, hist.minus(find(start, suffix)), samples[metric]))
    return CrossCheck(tuple(checks), tuple(missing))


def compare(metric: str, hist: Histogram, values: Sequence[float]) -> MetricCheck:
    a = np.sort(np.asarray(values, dtype=np.float64))
    quantiles = []
    for q in QUANTILES:
        bench = float(np.percentile(a, q * 100)) if a.size else math.nan
        server = hist.quantile(q)
        quantiles.append(QuantileCheck(q, bench * 1e3, server * 1e3, _near(hist.bounds, bench, server)))
    return MetricCheck(metric, hist.name, int(a.size), hist.count, tuple(quantiles), _cdf_gap(hist, a))


def _near(bounds: Sequence[float], a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    return abs(bisect_left(bounds, a) - bisect_left(bounds, b)) <= 1


def _cdf_gap(hist: Histogram, sorted_values: np.ndarray) -> float:
    if not sorted_values.size or not hist.count:
        return math.nan
    gaps = [abs(float(np.searchsorted(sorted_values, bound, side="right")) / sorted_values.size
                - hist.fraction_at_most(i))
            for i, bound in enumerate(hist.bounds) if math.isfinite(bound)]
    return max(gaps, default=math.nan)
