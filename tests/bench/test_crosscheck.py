"""Prometheus histograms: parsing, histogram_quantile, deltas, and the comparison with the bench's samples."""

from __future__ import annotations

import math

import pytest

from bench.loadgen.crosscheck import compare, cross_check
from bench.loadgen.metrics import RequestMetrics
from bench.loadgen.promtext import Histogram, find, gauge_values, parse_histograms

BOUNDS = (0.01, 0.02, 0.04, 0.08)


def exposition(name: str, values: list[float], labels: str = "") -> str:
    lines = [f"# TYPE {name} histogram"]
    for bound in (*BOUNDS, math.inf):
        le = "+Inf" if math.isinf(bound) else repr(bound)
        count = sum(v <= bound for v in values)
        lines.append(f'{name}_bucket{{{labels}le="{le}"}} {float(count)}')
    lines += [f"{name}_count{{{labels[:-1]}}} {float(len(values))}" if labels else f"{name}_count {len(values)}.0",
              f"{name}_sum {sum(values)}"]
    return "\n".join(lines) + "\n"


def test_parse_and_quantile_like_prometheus() -> None:
    text = exposition("vllm:time_to_first_token_seconds", [0.005] * 5 + [0.03] * 5)
    h = parse_histograms(text)["vllm:time_to_first_token_seconds"]
    assert h.counts == (5.0, 5.0, 10.0, 10.0, 10.0) and h.count == 10 and h.total == pytest.approx(0.175)
    assert h.quantile(0.5) == pytest.approx(0.01)  # rank 5 ends the first bucket
    assert h.quantile(0.75) == pytest.approx(0.02 + 0.02 * 0.5)  # linear inside (0.02, 0.04]
    assert find(parse_histograms(text), "time_to_first_token_seconds") == h  # whatever the server's prefix
    over = Histogram("x", (*BOUNDS, math.inf), (0, 0, 0, 0, 4), 1.0)
    assert over.quantile(0.5) == 0.08  # the +Inf bucket: the highest finite bound
    assert math.isnan(Histogram("x", (1.0, math.inf), (0, 0), 0).quantile(0.5))


def test_labelled_series_are_summed_and_deltas_taken() -> None:
    a = exposition("m", [0.005, 0.03], labels='model="a",')
    b = exposition("m", [0.05], labels='model="b",')
    h = parse_histograms(a + b)["m"]
    assert h.count == 3
    later = parse_histograms(exposition("m", [0.005, 0.03, 0.03, 0.05, 0.05]))["m"]
    assert later.minus(h).counts == (0.0, 0.0, 1.0, 2.0, 2.0)  # cumulative, like the buckets
    assert gauge_values('g 2\ng{x="1"} 3\n# c\nbad line\n') == {"g": 5.0}  # label sets summed


def test_bench_samples_against_matching_and_shifted_histograms() -> None:
    values = [0.012, 0.015, 0.018, 0.025, 0.03, 0.035, 0.05, 0.06, 0.07, 0.075]
    same = parse_histograms(exposition("t", values))["t"]
    check = compare("ttft", same, values)
    assert check.consistent and check.cdf_gap == pytest.approx(0.0)
    shifted = compare("ttft", same, [v * 4 for v in values])
    assert not shifted.consistent and shifted.cdf_gap > 0.5


def test_cross_check_reports_missing_histograms() -> None:
    ok = [RequestMetrics(0.015, 0.01, 0.2, (0.01, 0.012), 5, 3, "usage")]
    after = exposition("pagedserve:time_to_first_token_seconds", [0.015])
    check = cross_check("", after, ok)
    assert [c.metric for c in check.checks] == ["ttft"] and set(check.missing) == {"itl", "tpot", "e2e"}
    assert cross_check("", "", ok).missing == ("ttft", "itl", "tpot", "e2e")
