"""Prometheus metrics: requests run through the engine core (and the offline LLM) on the sim backend, then the
registry's /metrics text, parsed with prometheus-client's parser, must agree with what the engine reported."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from backends.model.loader import ModelFiles
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import Engine
from scheduler.errors import QueueFullError
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry import Telemetry, TelemetryConfig
from tests.telemetry.rig import BLOCK_SIZE, make_rig, sim_backend

REQUIRED = [
    "time_to_first_token_seconds", "inter_token_latency_seconds", "time_per_output_token_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds", "prefix_cache_queries_total",
    "prefix_cache_hits_total", "num_preemptions_total",
    "prompt_tokens_total", "generation_tokens_total", "request_success_total", "request_rejected_total",
    "slow_token_total", "engine_step_duration_seconds", "engine_step_batch_size",
]
SERVICE_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio", "kv_cache_blocks")
METRICS_ONLY = TelemetryConfig(exporter="none")


def samples(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = telemetry.render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(table: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return table[(f"pagedserve:{name}", tuple(sorted(labels.items())))]


def metrics_only(clock: Callable[[], float]) -> Telemetry:
    return Telemetry(METRICS_ONLY, clock=clock)


def test_metrics_agree_with_the_engine(files: ModelFiles) -> None:
    rig, telemetry = make_rig(files, metrics_only, max_num_batched_tokens=128)
    shared = 48  # requests 0 and 3 share a 3-block prefix: the second one hits the prefix cache
    specs = [(shared, 7, 0), (30, 1, 1), (100, 12, 2), (shared, 5, 0), (200, 9, 4), (20, 16, 5)]
    for i, (prompt, max_tokens, seed) in enumerate(specs[:3]):
        rig.submit(f"r{i}", prompt, max_tokens, seed=seed)
    for _ in range(4):
        rig.step()
    for i, (prompt, max_tokens, seed) in enumerate(specs[3:], start=3):
        rig.submit(f"r{i}", prompt, max_tokens, seed=seed)
    outs = rig.run()
    assert telemetry.flush()
    m, records, steps = samples(telemetry), rig.tee.finished, rig.tee.steps
    telemetry.shutdown()

    n = len(specs)
    completion = [len(outs[f"r{i}"].choices[0].token_ids) for i in range(n)]
    assert completion == [s[1] for s in specs]
    assert value(m, "generation_tokens_total") == sum(completion)
    assert value(m, "prompt_tokens_total") == sum(s[0] for s in specs)
    assert value(m, "request_success_total", finished_reason="length") == n

    ttft = sum(r.first_token - r.arrival for r in records.values())  # type: ignore[operator]
    e2e = sum(r.finished - r.arrival for r in records.values())
    decode = sum(r.finished - r.first_token for r in records.values())  # type: ignore[operator]
    queue = sum(r.first_scheduled - r.arrival for r in records.values())  # type: ignore[operator]
    assert value(m, "time_to_first_token_seconds_count") == n
    assert value(m, "time_to_first_token_seconds_sum") == pytest.approx(ttft)
    assert value(m, "e2e_request_latency_seconds_count") == n
    assert value(m, "e2e_request_latency_seconds_sum") == pytest.approx(e2e)
    assert value(m, "request_queue_time_seconds_count") == n
    assert value(m, "request_queue_time_seconds_sum") == pytest.approx(queue, abs=1e-9)
    assert value(m, "inter_token_latency_seconds_count") == sum(c - 1 for c in completion)
    assert value(m, "inter_token_latency_seconds_sum") == pytest.approx(decode)  # the gaps add up
    assert value(m, "time_per_output_token_seconds_count") == sum(c > 1 for c in completion)

    assert value(m, "engine_step_duration_seconds_count") == len(steps)
    assert value(m, "engine_step_duration_seconds_sum") == pytest.approx(sum(s.end - s.start for s in steps))
    assert value(m, "engine_step_batch_size_sum") == sum(s.num_seqs for s in steps)
    kv = rig.core.kv.stats()
    assert value(m, "prefix_cache_queries_total") == kv.prefix_queries > 0
    assert value(m, "prefix_cache_hits_total") == kv.prefix_hits > 0  # the shared prefix, less its last block
    assert value(m, "num_preemptions_total") == 0
    for cause in ("preemption", "queue", "prefill_interference", "slow_step"):
        assert (("pagedserve:slow_token_total", (("cause", cause),))) in m


def test_offline_llm_counts(files: ModelFiles) -> None:
    backend = sim_backend(files, "zero", "real")
    backend.init_cache(256, BLOCK_SIZE)
    telemetry = Telemetry(METRICS_ONLY)
    kv = PagedKVCacheManager(256, BLOCK_SIZE)
    llm = LLM(SchedulerConfig(), kv, backend, files.tokenizer, max_model_len=1024, observer=telemetry)
    prompts = [[1000 + 17 * i + j for j in range(10 + i)] for i in range(8)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert telemetry.flush()
    m = samples(telemetry)
    telemetry.shutdown()
    assert value(m, "generation_tokens_total") == sum(len(o.choices[0].token_ids) for o in outs) == 48
    assert value(m, "prompt_tokens_total") == sum(map(len, prompts))
    assert value(m, "time_to_first_token_seconds_count") == 8
    assert value(m, "inter_token_latency_seconds_count") == 8 * 5
    assert value(m, "request_success_total", finished_reason="length") == 8


def test_rejections_counted(files: ModelFiles) -> None:
    rig, telemetry = make_rig(files, metrics_only, max_waiting_requests=2)
    rig.submit("a", 10, 2)
    rig.submit("b", 10, 2, seed=1)
    with pytest.raises(QueueFullError):
        rig.submit("c", 10, 2, seed=2)
    rig.run()
    assert telemetry.flush()
    m = samples(telemetry)
    telemetry.shutdown()
    assert value(m, "request_rejected_total", reason="queue_full") == 1
    assert value(m, "request_success_total", finished_reason="length") == 2


def test_required_names_and_owned_registries() -> None:
    first, second = Telemetry(METRICS_ONLY), Telemetry(METRICS_ONLY)  # no global registry: no clash
    text = first.render().decode()
    for name in REQUIRED:
        assert f"pagedserve:{name}" in text, name
    for name in SERVICE_GAUGES:  # the service's, read live from the engine: exported once, by it
        assert f"pagedserve:{name}" not in text, name
    shared = CollectorRegistry()
    Counter("pagedserve:http_requests", "the service's own", registry=shared)
    third = Telemetry(METRICS_ONLY, registry=shared)
    assert third.metrics.registry is shared
    assert b"pagedserve:http_requests_total" in third.render() and b"pagedserve:ttft" not in third.render()
    assert b"pagedserve:time_to_first_token_seconds_count" in third.render()
    for telemetry in (first, second, third):
        telemetry.shutdown()


def test_async_engine_metrics_match_what_clients_saw(files: ModelFiles) -> None:
    backend = sim_backend(files, "zero", "real")
    backend.init_cache(256, BLOCK_SIZE)
    telemetry = Telemetry(METRICS_ONLY)
    engine = Engine(SchedulerConfig(), PagedKVCacheManager(256, BLOCK_SIZE), backend,
                    files.tokenizer, max_model_len=1024, observer=telemetry)

    async def clients() -> list[int]:
        await engine.start()
        streams = [engine.submit(EngineRequest(f"c{i}", tuple(range(2000, 2012 + i)),
                                               SamplingParams(temperature=0.0, max_tokens=5 + i, ignore_eos=True)))
                   for i in range(6)]
        outs = await asyncio.gather(*(s.collect() for s in streams))
        await engine.stop()
        return [len(o.choices[0].token_ids) for o in outs]

    seen = asyncio.run(asyncio.wait_for(clients(), 30))
    assert telemetry.flush()
    m = samples(telemetry)
    telemetry.shutdown()
    assert value(m, "generation_tokens_total") == sum(seen) == sum(5 + i for i in range(6))
    assert value(m, "time_to_first_token_seconds_count") == 6
    assert value(m, "inter_token_latency_seconds_count") == sum(n - 1 for n in seen)
    assert value(m, "request_success_total", finished_reason="length") == 6
    assert value(m, "e2e_request_latency_seconds_sum") > 0
