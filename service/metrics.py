"""The app's Prometheus registry: engine gauges read at scrape time, plus HTTP request counts.
The telemetry package registers its own collectors into the same registry."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.state import Phase, ServerState


class EngineCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def describe(self) -> Iterator[Metric]:
        return iter(())  # keeps registration from calling collect() before the engine exists

    def collect(self) -> Iterator[Metric]:
        phase = GaugeMetricFamily("pagedserve_server_phase", "1 for the server's current phase", labels=["phase"])
        for p in Phase:
            phase.add_metric([p.value], float(p is self._state.phase))
        yield phase
        if self._state.runtime is not None:
            yield from _engine_gauges(self._state.runtime.engine.stats())


def _engine_gauges(stats: object) -> Iterator[Metric]:
    kv = getattr(stats, "kv", None)
    yield GaugeMetricFamily("pagedserve_num_requests_running", "Requests being generated",
                            value=getattr(stats, "num_running", 0))
    yield GaugeMetricFamily("pagedserve_num_requests_waiting", "Requests waiting for admission",
                            value=getattr(stats, "num_waiting", 0))
    if kv is not None:
        yield GaugeMetricFamily("pagedserve_kv_cache_usage_ratio", "Share of KV blocks in use", value=kv.usage)
        blocks = GaugeMetricFamily("pagedserve_kv_cache_blocks", "KV blocks by state", labels=["state"])
        blocks.add_metric(["used"], kv.used_blocks)
        blocks.add_metric(["free"], kv.free_blocks)
        yield blocks


def create_registry(state: ServerState) -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    registry.register(EngineCollector(state))
    requests = Counter("pagedserve_http_requests", "HTTP requests answered", ["method", "route", "status"],
                       registry=registry)
    return registry, requests
