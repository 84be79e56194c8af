"""The open-loop arrival process follows its distribution (fixed seeds, so the statistics are deterministic)."""

from __future__ import annotations

import math
import statistics
from itertools import islice

import pytest

from bench.loadgen.arrivals import arrival_times, gaps

N = 20_000
KS_CRITICAL_1PCT = 1.63  # Kolmogorov-Smirnov: sqrt(n) * D exceeds this with probability 1 % under H0


def gamma_cdf(shape: float, scale: float, x: float) -> float:
    """Regularized lower incomplete gamma P(shape, x / scale), by its power series."""
    if x <= 0:
        return 0.0
    z = x / scale
    term = total = 1.0 / shape
    for n in range(1, 5000):
        term *= z / (shape + n)
        total += term
        if term < total * 1e-15:
            break
    return min(1.0, total * math.exp(shape * math.log(z) - z - math.lgamma(shape)))


def ks_statistic(sample: list[float], cdf: object) -> float:
    xs = sorted(sample)
    n = len(xs)
    f = [cdf(x) for x in xs]  # type: ignore[operator]
    return max(max((i + 1) / n - f[i], f[i] - i / n) for i in range(n))


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_gaps_follow_gamma_with_mean_one_over_rate(burstiness: float) -> None:
    rate = 8.0
    sample = list(islice(gaps(rate, burstiness, seed=3), N))
    mean = statistics.fmean(sample)
    cv = statistics.pstdev(sample) / mean
    # 4 standard errors of the mean of N gamma gaps (SE = 1 / sqrt(kN): 0.35-1.4 %); measured at most 0.41 %
    assert mean == pytest.approx(1 / rate, rel=4 / math.sqrt(burstiness * N))
    # burstiness k: CV = 1/sqrt(k); measured at most 2.1 % off (k = 0.25, the heaviest tail); bound 2.4x
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    scale = 1 / (rate * burstiness)
    d = ks_statistic(sample, lambda x: gamma_cdf(burstiness, scale, x))
    assert math.sqrt(N) * d < KS_CRITICAL_1PCT


def test_poisson_counts_have_variance_equal_to_mean() -> None:
    rate, window, horizon = 20.0, 1.0, 1000.0
    counts = [0] * int(horizon / window)
    for t in arrival_times(rate, 1.0, seed=5):
        if t >= horizon:
            break
        counts[int(t / window)] += 1
    mean, var = statistics.fmean(counts), statistics.pvariance(counts)
    assert mean == pytest.approx(rate, rel=0.02)  # 2.8 standard errors (sqrt(20 / 1000) / 20); measured 0.47 %
    # index of dispersion of a Poisson process: 2.7 standard errors (sqrt(2 / 999)); measured 0.011
    assert var / mean == pytest.approx(1.0, abs=0.12)


def test_bursty_counts_are_overdispersed() -> None:
    counts = [0] * 500
    for t in arrival_times(20.0, 0.25, seed=5):
        if t >= 500:
            break
        counts[int(t)] += 1
    assert statistics.pvariance(counts) / statistics.fmean(counts) > 2.5  # ~1/k = 4 for gamma renewals


def test_seeded_and_infinite_rate() -> None:
    assert list(islice(gaps(5.0, 1.0, 7), 50)) == list(islice(gaps(5.0, 1.0, 7), 50))
    assert list(islice(gaps(5.0, 1.0, 7), 50)) != list(islice(gaps(5.0, 1.0, 8), 50))
    assert list(islice(arrival_times(math.inf), 5)) == [0.0] * 5
    assert next(arrival_times(3.0)) == 0.0


def test_the_tests_can_fail() -> None:
    """Negative controls: the CDF is right where it is known, and the KS test rejects the wrong shape."""
    assert gamma_cdf(1.0, 1.0, 1.0) == pytest.approx(1 - math.exp(-1))
    assert gamma_cdf(2.0, 1.0, 2.0) == pytest.approx(1 - 3 * math.exp(-2))
    sample = list(islice(gaps(8.0, 0.5, seed=3), 5000))
    assert math.sqrt(5000) * ks_statistic(sample, lambda x: gamma_cdf(1.0, 1 / 8.0, x)) > KS_CRITICAL_1PCT
