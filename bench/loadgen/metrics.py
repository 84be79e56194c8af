"""Latency and throughput with vLLM's benchmark definitions.

- TTFT: send -> first chunk that carries text.
- TPOT (per request, output tokens > 1): (E2E - TTFT) / (output tokens - 1).
- ITL: the gaps between consecutive text chunks, all requests pooled (a chunk may hold several tokens when the
  server merges them).
- E2E: send -> end of the stream.
- Throughputs: completed requests, output tokens and prompt + output tokens, each over the run's wall time.
- Goodput: completed requests per second that met every SLO given.
Output tokens come from the server's usage chunk; without one, from `count_tokens` on the text; without
that, the number of text chunks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.loadgen.client import RequestResult
from bench.loadgen.runner import RunRecord
from bench.loadgen.slo import Slo

TokenCounter = Callable[[str], int]
PERCENTILES = (50, 90, 95, 99)
MS = 1000.0


@dataclass(frozen=True)
class Stats:
    """Summary statistics of a sample (milliseconds for latencies); NaN where the sample is empty."""

    count: int
    mean: float
    std: float
    p50: float
    p90: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float], scale: float = 1.0) -> Stats:
        if not values:
            return cls(0, *([math.nan] * 8))
        a = np.asarray(values, dtype=np.float64) * scale
        p50, p90, p95, p99 = (float(v) for v in np.percentile(a, PERCENTILES))
        return cls(len(a), float(a.mean()), float(a.std()), p50, p90, p95, p99, float(a.min()), float(a.max()))

    def percentile(self, p: int) -> float:
        return float(getattr(self, f"p{p}"))


@dataclass(frozen=True)
class RequestMetrics:
    """One successful request's figures (seconds)."""

    ttft: float | None  # None: no text came back
    tpot: float | None  # None: fewer than two output tokens
    e2e: float
    itls: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    token_source: str  # usage | tokenizer | chunks


def request_metrics(r: RequestResult, count_tokens: TokenCounter | None = None) -> RequestMetrics:
    ttft = r.chunk_times[0] - r.start if r.chunk_times else None
    e2e = r.end - r.start
    output, source = _output_tokens(r, count_tokens)
    tpot = (e2e - ttft) / (output - 1) if ttft is not None and output > 1 else None
    itls = tuple(b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False))
    prompt = r.prompt_tokens if r.prompt_tokens is not None else (count_tokens(r.prompt) if count_tokens else 0)
    return RequestMetrics(ttft, tpot, e2e, itls, prompt, output, source)


def _output_tokens(r: RequestResult, count_tokens: TokenCounter | None) -> tuple[int, str]:
    if r.output_tokens is not None:
        return r.output_tokens, "usage"
    if count_tokens is not None:
        return count_tokens(r.text), "tokenizer"
    return len(r.chunk_times), "chunks"


@dataclass(frozen=True)
class Summary:
    label: str
    completed: int
    failed: int
    errors: dict[str, int]  # error kind ("HTTP 503", "timeout", ...) -> count
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float  # requests/s
    output_throughput: float  # output tokens/s
    total_token_throughput: float  # (prompt + output) tokens/s
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    slo: Slo | None
    good_requests: int | None  # completed requests that met every SLO
    goodput: float | None  # good requests/s
    token_source: dict[str, int]  # where output counts came from: usage, tokenizer, chunks


def summarize(run: RunRecord, slo: Slo | None = None, count_tokens: TokenCounter | None = None) -> Summary:
    ok = ok_metrics(run.results, count_tokens)
    return summary_of(run.shape.label(), ok, error_counts(run.results), run.duration_s, slo)


def ok_metrics(results: Iterable[RequestResult], count_tokens: TokenCounter | None = None,
               ) -> tuple[RequestMetrics, ...]:
    return tuple(request_metrics(r, count_tokens) for r in results if r.ok)


def error_counts(results: Iterable[RequestResult]) -> dict[str, int]:
    return dict(Counter(r.error for r in results if not r.ok))


def summary_of(label: str, ok: Sequence[RequestMetrics], errors: dict[str, int], duration_s: float,
               slo: Slo | None = None) -> Summary:
    input_tokens = sum(m.prompt_tokens for m in ok)
    output_tokens = sum(m.output_tokens for m in ok)
    good = sum(slo.met(m.ttft, m.tpot, m.e2e) for m in ok) if slo is not None else None
    return Summary(
        label=label, completed=len(ok), failed=sum(errors.values()), errors=errors, duration_s=duration_s,
        input_tokens=input_tokens, output_tokens=output_tokens,
        request_throughput=len(ok) / duration_s, output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        ttft_ms=Stats.of(_present(m.ttft for m in ok), MS), tpot_ms=Stats.of(_present(m.tpot for m in ok), MS),
        itl_ms=Stats.of([gap for m in ok for gap in m.itls], MS), e2e_ms=Stats.of([m.e2e for m in ok], MS),
        slo=slo, good_requests=good, goodput=None if good is None else good / duration_s,
        token_source=dict(Counter(m.token_source for m in ok)))


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]
