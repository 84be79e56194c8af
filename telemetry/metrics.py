"""Prometheus metrics, in a registry this object owns (or one the service hands it), fed as a tracker sink.

The values live in plain Python numbers updated by the telemetry worker thread (a bisect and two adds per
token, where prometheus-client's own Histogram takes a lock and several microseconds) and are turned into
metric families only when /metrics is scraped. Latency buckets span GPU speeds (a few ms per token) and CPU
speeds (hundreds of ms per token, seconds to first token), so one set of buckets serves every backend.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from telemetry.interface import STEP_FAILURE_CAUSES, RequestRecord, StepRecord, TokenRecord
from telemetry.itl import CAUSES, SlowToken
from telemetry.tracker import RequestState

PREFIX = "pagedserve:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# 1 ms .. 80 s: GPU time to first token sits in the first decade, a CPU prefill of a long prompt near the end.
REQUEST_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0,
                           1.5, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# 0.5 ms .. 10 s per token: a GPU decode step is a few ms, a CPU one 50-500 ms, a slow token a multiple.
TOKEN_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                         0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = REQUEST_LATENCY_BUCKETS + (160.0, 320.0, 640.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STEP_TOKEN_BUCKETS = BATCH_BUCKETS + (2048, 4096, 8192)
# measured / predicted step time: 1 is a perfect prediction; over 1, the step ran longer than planned.
PREDICTION_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0)
FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("queue_full",)


class Histogram:
    """Bucket counts and a sum; written by one thread, read (copied) at scrape time."""

    def __init__(self, name: str, doc: str, bounds: Iterable[float]) -> None:
        self.name, self.doc = PREFIX + name, doc
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # buckets are "less than or equal"
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def family(self) -> HistogramMetricFamily:
        counts, total, running = list(self.counts), self.sum, 0
        buckets = []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            running += count
            buckets.append((bound, running))
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=total)


class Labelled:
    """A counter per label value."""

    def __init__(self, name: str, doc: str, label: str, known: Iterable[str] = ()) -> None:
        self.name, self.doc, self.label = PREFIX + name, doc, label
        self.values: dict[str, float] = dict.fromkeys(known, 0.0)  # exported as 0 from the start

    def inc(self, value: str, amount: float = 1.0) -> None:
        self.values[value] = self.values.get(value, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for value, count in list(self.values.items()):
            family.add_metric([value], count)
        return family


class TelemetryMetrics(Collector):
    """Every metric of the server's /metrics that telemetry owns; `render()` renders the whole registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.histograms = self._histograms()
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)
        self.success = Labelled("request_success", "Finished requests, per choice finish reason",
                                "finished_reason", FINISH_REASONS)
        self.rejections = Labelled("request_rejected", "Requests refused at admission", "reason", REJECT_REASONS)
        self.slow_tokens = Labelled("slow_token", "Tokens whose gap exceeded the slow threshold, by cause",
                                    "cause", CAUSES)
        self.step_failures = Labelled("engine_step_failures", "Engine steps that failed (their requests failed)",
                                      "cause", STEP_FAILURE_CAUSES)
        self.cost_coefficients: tuple[tuple[str, float], ...] = ()
        self._drop_lock = threading.Lock()  # drops are counted from two threads
        self.registry.register(self)

    @staticmethod
    def _histograms() -> dict[str, Histogram]:
        return {h.name[len(PREFIX):]: h for h in (
            Histogram("time_to_first_token_seconds", "Time from arrival to the first output token",
                      REQUEST_LATENCY_BUCKETS),
            Histogram("inter_token_latency_seconds", "Time between consecutive outputs of a request (a token, or "
                      "several: a step that keeps speculative guesses, or one per choice)",
                      TOKEN_LATENCY_BUCKETS),
            Histogram("time_per_output_token_seconds", "Per request: decode time / output tokens after the first "
                      "step's, per choice",
                      TOKEN_LATENCY_BUCKETS),
            Histogram("e2e_request_latency_seconds", "Time from arrival to the request's end", E2E_BUCKETS),
            Histogram("request_queue_time_seconds", "Time from arrival to the request's first scheduled step",
                      REQUEST_LATENCY_BUCKETS),
            Histogram("engine_step_duration_seconds", "Wall time of one engine step", TOKEN_LATENCY_BUCKETS),
            Histogram("engine_step_batch_size", "Sequences in one engine step", BATCH_BUCKETS),
            Histogram("engine_step_tokens", "Tokens computed in one engine step", STEP_TOKEN_BUCKETS),
            Histogram("step_cost_prediction_ratio", "Per engine step: its measured time / the step-cost model's "
                      "prediction when it was planned", PREDICTION_RATIO_BUCKETS),
        )}

    def describe(self) -> Iterator[Metric]:
        return iter(())  # registration must not call collect()

    def collect(self) -> Iterator[Metric]:
        for histogram in self.histograms.values():
            yield histogram.family()
        for name, value in list(self.counters.items()):
            yield CounterMetricFamily(PREFIX + name, COUNTERS[name], value=value)
        for name, value in list(self.gauges.items()):
            yield GaugeMetricFamily(PREFIX + name, GAUGES[name], value=value)
        for labelled in (self.success, self.rejections, self.slow_tokens, self.step_failures):
            yield labelled.family()
        if self.cost_coefficients:
            cost = GaugeMetricFamily(PREFIX + "step_cost_seconds", "The step-cost model's fitted seconds per "
                                     "step, token, sampled row, KV token read and attention pair", labels=["per"])
            for name, value in self.cost_coefficients:
                cost.add_metric([name], value)
            yield cost

    def render(self) -> bytes:
        """The Prometheus text exposition of the registry (serve with CONTENT_TYPE)."""
        return generate_latest(self.registry)

    def add_dropped_spans(self, count: int) -> None:
        with self._drop_lock:
            self.counters["telemetry_spans_dropped"] += count

    def add_skipped_events(self, count: int) -> None:
        self.counters["telemetry_token_events_skipped"] += count

    # --- tracker sink ----------------------------------------------------------------------------
    def queued(self, state: RequestState) -> None:
        pass

    def preempted(self, state: RequestState, now: float) -> None:
        self.counters["num_preemptions"] += 1

    def wait_ended(self, state: RequestState, start: float, end: float) -> None:
        if state.preemptions == 0:
            self.histograms["request_queue_time_seconds"].observe(end - start)

    def prefill_chunk(self, state: RequestState, step: StepRecord, tokens: int) -> None:
        pass

    def tokens(self, state: RequestState, step: StepRecord, record: TokenRecord, first_index: int, gap: float,
               slow: SlowToken | None) -> None:
        if first_index == 0:
            self.histograms["time_to_first_token_seconds"].observe(gap)
            self.counters["prompt_tokens"] += state.prompt_tokens
        else:
            self.histograms["inter_token_latency_seconds"].observe(gap)
        if slow is not None:
            self.slow_tokens.inc(slow.cause)

    def step(self, step: StepRecord, tokens: int) -> None:
        self.counters["generation_tokens"] += tokens
        histograms = self.histograms
        histograms["engine_step_duration_seconds"].observe(step.end - step.start)
        histograms["engine_step_batch_size"].observe(step.num_seqs)
        histograms["engine_step_tokens"].observe(step.prefill_tokens + step.decode_tokens)
        if step.predicted_s > 0 and step.seconds > 0:
            histograms["step_cost_prediction_ratio"].observe(step.seconds / step.predicted_s)
            self.cost_coefficients = step.cost_coefficients
            self.gauges["step_cost_headroom"] = step.cost_headroom
        # cumulative in the engine: they only grow, except after a reset of the pool's counters
        self.counters["prefix_cache_queries"] = max(self.counters["prefix_cache_queries"], step.prefix_queries)
        self.counters["prefix_cache_hits"] = max(self.counters["prefix_cache_hits"], step.prefix_hits)

    def finished(self, state: RequestState, record: RequestRecord) -> None:
        self.histograms["e2e_request_latency_seconds"].observe(record.finished - state.queued_at)
        if state.first_token is not None and state.last_token is not None and state.later_tokens_per_choice > 0:
            self.histograms["time_per_output_token_seconds"].observe(
                (state.last_token - state.first_token) / state.later_tokens_per_choice)
        if record.error is not None:
            self.counters["request_failure"] += 1
            return
        for reason in record.finish_reason.split(","):
            self.success.inc(reason)

    def rejected(self, reason: str) -> None:
        self.rejections.inc(reason)

    def step_failed(self, cause: str) -> None:
        self.step_failures.inc(cause)


COUNTERS = {
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache",
    "prefix_cache_hits": "Prompt tokens served from the prefix cache",
    "num_preemptions": "Sequences preempted (KV freed, to be recomputed)",
    "prompt_tokens": "Prompt tokens of requests whose prefill finished",
    "generation_tokens": "Output tokens generated",
    "request_failure": "Requests ended by an error",
    "telemetry_spans_dropped": "Trace spans dropped (export failed, export queue full, or shut down first)",
    "telemetry_token_events_skipped": "Per-token span events skipped while telemetry fell behind the engine",
}
# Requests running and waiting and KV cache usage are the service's (service/app/metrics.py): read from the engine
# at scrape time, they are current even between steps.
GAUGES = {
    "itl_target_seconds": "The inter-token-latency target the scheduler holds steps to while sequences decode "
                          "(configured, or derived from a decode step's calibrated cost); 0: off",
    "step_cost_headroom": "The factor the scheduler divides its ITL target by: recent steps' measured / "
                          "predicted time, high quantile, at least 1",
}
