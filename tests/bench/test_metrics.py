"""Metric definitions on synthetic streams with known timings."""

from __future__ import annotations

import math

import pytest

from bench.loadgen.client import RequestResult
from bench.loadgen.metrics import Stats, request_metrics, summarize
from bench.loadgen.runner import RunRecord
from bench.loadgen.slo import Slo, parse_slo
from bench.loadgen.spec import Bounds, LoadShape


def stream(start: float, first: float, gap: float, chunks: int, tokens: int | None = None,
           prompt_tokens: int | None = 10, error: str = "") -> RequestResult:
    """A request sent at `start` whose first text chunk came `first` s later, then one every `gap` s; the stream
    ended one gap after the last chunk."""
    times = tuple(start + first + i * gap for i in range(chunks))
    end = (times[-1] if times else start) + gap
    return RequestResult(start, end, "p", times, "x" * chunks, prompt_tokens, tokens, error)


def test_single_request_figures() -> None:
    r = stream(start=100.0, first=0.2, gap=0.05, chunks=11, tokens=11)
    m = request_metrics(r)
    assert m.ttft == pytest.approx(0.2)
    assert m.e2e == pytest.approx(0.2 + 10 * 0.05 + 0.05)
    assert m.tpot == pytest.approx((m.e2e - 0.2) / 10)  # vLLM: (E2E - TTFT) / (output tokens - 1)
    assert m.itls == pytest.approx((0.05,) * 10)
    assert (m.output_tokens, m.token_source, m.prompt_tokens) == (11, "usage", 10)


def test_usage_beats_chunks_and_tokenizer_fills_in() -> None:
    merged = stream(0.0, 0.1, 0.1, chunks=3, tokens=9)  # a paced stream: 9 tokens in 3 chunks
    assert request_metrics(merged).output_tokens == 9
    assert request_metrics(merged).tpot == pytest.approx((0.1 + 0.2 + 0.1 - 0.1) / 8)
    bare = stream(0.0, 0.1, 0.1, chunks=3, tokens=None, prompt_tokens=None)
    assert (request_metrics(bare).output_tokens, request_metrics(bare).token_source) == (3, "chunks")
    counted = request_metrics(bare, count_tokens=lambda text: 2 * len(text))
    assert (counted.output_tokens, counted.token_source, counted.prompt_tokens) == (6, "tokenizer", 2)


def test_one_token_has_no_tpot_and_no_text_has_no_ttft() -> None:
    assert request_metrics(stream(0.0, 0.1, 0.1, chunks=1, tokens=1)).tpot is None
    empty = request_metrics(stream(0.0, 0.1, 0.1, chunks=0, tokens=0))
    assert empty.ttft is None and empty.tpot is None and empty.itls == ()


def test_stats_match_numpy_conventions() -> None:
    s = Stats.of([float(v) for v in range(1, 101)], scale=1000.0)
    assert s.count == 100 and s.mean == pytest.approx(50_500.0)
    assert s.p50 == pytest.approx(50_500.0) and s.p99 == pytest.approx(99_010.0)  # linear interpolation
    assert s.std == pytest.approx(28_866.07, rel=1e-5)  # population std, as vLLM reports
    assert math.isnan(Stats.of([]).p50)


def test_summary_throughput_goodput_and_errors() -> None:
    ok = [stream(float(i), 0.1 * (i + 1), 0.01, chunks=5, tokens=5, prompt_tokens=20) for i in range(4)]
    failed = [RequestResult(0.0, 0.1, error="HTTP 503"), RequestResult(0.0, 0.1, error="HTTP 503"),
              RequestResult(0.0, 0.5, error="timeout")]
    run = RunRecord(LoadShape(concurrency=2), Bounds(7), (*ok, *failed), start=0.0, end=10.0)
    s = summarize(run, slo=Slo(ttft=0.25))
    assert (s.completed, s.failed, s.errors) == (4, 3, {"HTTP 503": 2, "timeout": 1})
    assert s.request_throughput == pytest.approx(0.4)
    assert s.output_throughput == pytest.approx(2.0) and s.total_token_throughput == pytest.approx(10.0)
    assert s.ttft_ms.p50 == pytest.approx(250.0) and s.ttft_ms.count == 4
    assert s.itl_ms.count == 16 and s.itl_ms.mean == pytest.approx(10.0)
    assert s.good_requests == 2 and s.goodput == pytest.approx(0.2)  # TTFT 100 and 200 ms meet 250 ms


def test_slo_parsing_and_rules() -> None:
    slo = parse_slo("ttft=500ms, tpot=0.05s,e2e=2000")
    assert slo == Slo(ttft=0.5, tpot=0.05, e2e=2.0)
    assert slo.text() == "ttft=500ms,tpot=50ms,e2e=2000ms"
    assert slo.met(0.4, 0.04, 1.0) and not slo.met(0.6, 0.04, 1.0) and not slo.met(0.4, 0.06, 1.0)
    assert slo.met(0.4, None, 1.0)  # one token: no TPOT to miss
    assert not Slo(ttft=1.0).met(None, None, 0.1)  # no text at all misses a TTFT bound
    for bad in ("", "ttft", "ttft=fast", "latency=5ms", "ttft=5min"):
        with pytest.raises(ValueError):
            parse_slo(bad)
