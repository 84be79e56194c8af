"""The app's one Prometheus registry: the server's phase and the engine's gauges, read at scrape time, and HTTP
request counts. Once the runtime is built, the app registers telemetry's metrics into it too (service/app/server.py):
/metrics renders this registry alone, every name under telemetry's `pagedserve:` prefix."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.core import EngineStats
from scheduler.speculation import SpecCounters
from service.generation.state import Phase, ServerState
from telemetry.metrics import PREFIX


class EngineCollector(Collector):
    """Live values at each scrape (telemetry's records arrive a step late, and not at all with it disabled)."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(())  # keeps registration from calling collect() before the engine exists

    def collect(self) -> Iterator[Metric]:
        phase = GaugeMetricFamily(PREFIX + "server_phase", "1 for the server's current phase", labels=["phase"])
        for p in Phase:
            phase.add_metric([p.value], float(p is self._state.phase))
        yield phase
        runtime = self._state.runtime
        stats = runtime.engine.stats() if runtime is not None else None
        yield from _engine_gauges(stats)
        if stats is not None and stats.speculation is not None:
            yield from _speculation(stats.speculation)
        if runtime is not None and runtime.backend_info:
            yield InfoMetricFamily(PREFIX + "backend", "What runs the model: the backend, the CPU tier its C "
                                   "kernels were built for, their precision, the weights' and KV cache's types",
                                   value=dict(runtime.backend_info))


def _engine_gauges(stats: EngineStats | None) -> Iterator[Metric]:
    """Zero until the engine exists: the series are there from the first scrape."""
    kv = stats.kv if stats is not None else None
    yield GaugeMetricFamily(PREFIX + "num_requests_running", "Requests in the running batch",
                            value=stats.num_running if stats is not None else 0)
    yield GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests waiting to be scheduled",
                            value=stats.num_waiting if stats is not None else 0)
    yield GaugeMetricFamily(PREFIX + "kv_cache_usage_ratio", "Share of KV cache blocks in use (0..1)",
                            value=kv.usage if kv is not None else 0.0)
    blocks = GaugeMetricFamily(PREFIX + "kv_cache_blocks", "KV cache blocks by state", labels=["state"])
    blocks.add_metric(["used"], kv.used_blocks if kv is not None else 0)
    blocks.add_metric(["free"], kv.free_blocks if kv is not None else 0)
    yield blocks
    yield GaugeMetricFamily(PREFIX + "kv_cache_blocks_cached", "Free KV cache blocks that still hold a prefix a "
                            "prompt can reuse (counted in kv_cache_blocks{state=\"free\"})",
                            value=kv.cached_free_blocks if kv is not None else 0)
    yield GaugeMetricFamily(PREFIX + "kv_cache_blocks_shared", "KV cache blocks in use by more than one sequence "
                            "(counted in kv_cache_blocks{state=\"used\"})",
                            value=stats.kv_shared_blocks if stats is not None else 0)
    window = GaugeMetricFamily(PREFIX + "kv_cache_window_blocks", "Blocks of the sliding-window layers' own pool "
                               "by state (a model with both kinds of layer; the kv_cache_blocks series count the "
                               "full-attention layers' pool then)", labels=["state"])
    window.add_metric(["used"], kv.window_used_blocks if kv is not None else 0)
    window.add_metric(["free"], kv.window_blocks - kv.window_used_blocks if kv is not None else 0)
    yield window


def _speculation(counters: SpecCounters) -> Iterator[Metric]:
    """Speculative decoding's totals, by method (vLLM's spec_decode_* counters); acceptance rate = accepted /
    draft tokens."""
    for name, help_text, value in (
            ("spec_decode_drafts", "Times a sequence's step verified guessed tokens", counters.steps),
            ("spec_decode_draft_tokens", "Guessed tokens verified", counters.proposed),
            ("spec_decode_accepted_tokens", "Guessed tokens the model agreed with (kept)", counters.accepted)):
        family = CounterMetricFamily(PREFIX + name, help_text, labels=["method"])
        family.add_metric([counters.method], value)
        yield family


def create_registry(state: ServerState) -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    registry.register(EngineCollector(state))
    requests = Counter(PREFIX + "http_requests", "HTTP requests answered", ["method", "route", "status"],
                       registry=registry)
    return registry, requests
