"""End to end against the real server on the sim backend: the bench's numbers, the server's /metrics, and the
step times the sim backend was told to take."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator

import pytest

from backends.model.loader import ModelFiles, open_model
from backends.sim_backend import CostModel, get_profile
from backends.step_shape import StepShape
from bench.loadgen.measure import Measurement, Options, measure
from bench.loadgen.spec import Bounds, LoadShape, RequestSpec, Target
from bench.loadgen.workloads import Lengths, RandomWorkload, SharedPrefixWorkload
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config


@pytest.fixture(scope="module")
def model_files() -> ModelFiles:
    return open_model()[1]


@pytest.fixture(scope="module")
def zero_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    server = LiveServer.start(sim_config(ServiceConfig(port=0)), cached_builder(model_files))
    yield server
    server.close()


def run(url: str, workload: object, shape: LoadShape, bounds: Bounds, endpoint: str = "completions",
        check: bool = True) -> Measurement:
    return asyncio.run(measure(Target(url, endpoint), workload, shape, bounds,  # type: ignore[arg-type]
                               Options(check_metrics=check)))


def test_completions_end_to_end(zero_server: LiveServer) -> None:
    workload = RandomWorkload(Lengths(24, "lognormal", 0.5), Lengths(12, "lognormal", 0.5), seed=1)
    m = run(zero_server.url, workload, LoadShape(concurrency=4), Bounds(24, warmup=2))
    s = m.summary
    assert (s.completed, s.failed) == (24, 0) and s.token_source == {"usage": 24}
    expected = [spec.max_tokens for spec in _first_specs(workload, 26)[2:]]
    assert s.output_tokens == sum(expected)  # ignore_eos: exactly max_tokens each
    assert s.ttft_ms.count == 24 and s.tpot_ms.count > 0 and s.output_throughput > 0
    assert m.cross_check is not None and not m.cross_check.missing
    ttft = next(c for c in m.cross_check.checks if c.metric == "ttft")
    assert ttft.server_count == 24 and ttft.bench_count == 24  # the same requests, warm-up excluded


def test_chat_and_shared_prefix_end_to_end(zero_server: LiveServer) -> None:
    workload = SharedPrefixWorkload(2, 64, Lengths(8), Lengths(4), seed=2)
    m = run(zero_server.url, workload, LoadShape(rate=200.0), Bounds(12), endpoint="chat", check=False)
    assert (m.summary.completed, m.summary.failed, m.summary.output_tokens) == (12, 0, 48)


def _first_specs(workload: RandomWorkload, n: int) -> list[RequestSpec]:
    sessions = workload.sessions()
    return [next(sessions).first() for _ in range(n)]


def test_measured_ttft_and_itl_equal_the_injected_step_times(model_files: ModelFiles) -> None:
    """The cpu profile sleeps each step's modelled time (~70 ms a decode step for this model): one request at
    a time, the bench must see that as ITL, and the prefill step's time as TTFT, within a tolerance."""
    config = sim_config(ServiceConfig(port=0, max_stream_events_per_s=0), profile="cpu")
    server = LiveServer.start(config, cached_builder(model_files))
    try:
        workload = RandomWorkload(Lengths(16), Lengths(6), seed=3)
        m = run(server.url, workload, LoadShape(concurrency=1), Bounds(3, warmup=1))
    finally:
        server.close()
    cost = CostModel(model_files.config, get_profile("cpu"))
    prompt = m.requests[0].prompt_tokens
    prefill = cost.cost(StepShape(prompt, 1, prompt, prompt * (prompt + 1) // 2)).seconds
    decode = statistics.fmean(cost.cost(StepShape(1, 1, prompt + i, prompt + i)).seconds for i in range(1, 6))
    ttft = statistics.median(r.ttft for r in m.requests if r.ttft is not None)
    itl = statistics.median(g for r in m.requests for g in r.itls)
    assert m.summary.itl_ms.count == 15
    assert decode * 0.98 <= itl <= decode * 1.2 + 0.010, (itl, decode)
    assert prefill * 0.98 <= ttft <= prefill * 1.2 + 0.030, (ttft, prefill)
    assert m.cross_check is not None
    server_itl = next(c for c in m.cross_check.checks if c.metric == "itl")
    assert server_itl.server_count == 15 and all(q.consistent for q in server_itl.quantiles)


def test_no_acceptance_rate_without_speculation(zero_server: LiveServer) -> None:
    """(tests/service/test_speculative_serving.py: the rate from a server that guesses.)"""
    m = run(zero_server.url, RandomWorkload(Lengths(8), Lengths(4), seed=4), LoadShape(concurrency=2), Bounds(4),
            check=False)
    assert m.speculation is None
