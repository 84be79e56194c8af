"""`Telemetry`: the engine's observer. Each hook queues the engine's record for the worker thread, which fans it
out to tracing and metrics; with telemetry disabled every hook returns at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from prometheus_client import CollectorRegistry

from telemetry.config import TelemetryConfig
from telemetry.context import RequestContext, as_request_context
from telemetry.export import ExportGuard, QuietExporterLogs, SheddingBatchProcessor, build_exporter, export_target
from telemetry.interface import RequestRecord, StepRecord, TokenRecord
from telemetry.metrics import TelemetryMetrics
from telemetry.spans import REQUEST_SPAN
from telemetry.tracing import SCOPE, EpochClock, ReservedIds, TraceSink, build_provider
from telemetry.tracker import Sink, Tracker
from telemetry.worker import Worker


class Telemetry:
    """Traces and Prometheus metrics for one engine. Create at app start (given the app's registry, its metrics
    are served with the app's), pass as the engine's observer, call `shutdown()` at cleanup (after the engine
    stopped). `render()` is the Prometheus text of its registry."""

    def __init__(self, config: TelemetryConfig | None = None, *, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic, span_exporter: SpanExporter | None = None) -> None:
        """`clock` is the engine's clock (its timestamps are converted to epoch time with one offset taken
        here); `span_exporter` replaces the configured exporter (tests, custom sinks)."""
        self.config = config or TelemetryConfig()
        self.metrics = TelemetryMetrics(registry)
        self._clock = clock
        self._provider: TracerProvider | None = None
        self._guard: ExportGuard | None = None
        self._quiet = QuietExporterLogs()
        self._closed = False
        if not self.config.enabled:
            self._worker: Worker | None = None
            return
        sinks: list[Sink] = [self.metrics]
        exporter = span_exporter if span_exporter is not None else build_exporter(self.config)
        self._worker = Worker()
        if exporter is not None:
            sinks.insert(0, self._start_tracing(exporter, clock, span_exporter))
        self._tracker = Tracker(sinks, self.config.slow_token_factor, self.config.slow_token_min_gaps)

    def _start_tracing(self, exporter: SpanExporter, clock: Callable[[], float], custom: SpanExporter | None
                       ) -> TraceSink:
        self._quiet.attach()
        target = export_target(self.config) if custom is None else type(custom).__name__
        self._guard = ExportGuard(exporter, target, self.metrics.add_dropped_spans, self._quiet)
        ids = ReservedIds()
        self._provider = build_provider(self.config, ids)
        self._provider.add_span_processor(SheddingBatchProcessor(self._guard, self.config))
        worker, limit = self._worker, self.config.max_backlog
        assert worker is not None
        return TraceSink(self._provider.get_tracer(SCOPE), self.config, EpochClock(clock),
                         overloaded=lambda: worker.backlog > limit, on_skip=self.metrics.add_skipped_events, ids=ids)

    @property
    def tracing(self) -> bool:
        return self._provider is not None

    @property
    def spans_dropped(self) -> int:
        return self._guard.dropped if self._guard is not None else 0

    def reserve(self, context: RequestContext) -> RequestContext:
        """`context` with its request span's ids chosen now, so the response can name the span (the W3C
        traceresponse header) before the worker makes it; unchanged when traces are off or the sampler would
        drop the span (a span that is never exported is not worth naming)."""
        if self._provider is None:
            return context
        parent = trace.get_current_span(context.parent).get_span_context()
        ids = RandomIdGenerator()  # not the provider's: the worker may be using its reserved ids right now
        trace_id = parent.trace_id if parent.is_valid else ids.generate_trace_id()
        decision = self._provider.sampler.should_sample(context.parent, trace_id, REQUEST_SPAN,
                                                        trace.SpanKind.SERVER).decision
        if not decision.is_sampled():
            return context
        span = trace.SpanContext(trace_id, ids.generate_span_id(), False, trace.TraceFlags(trace.TraceFlags.SAMPLED))
        return replace(context, span=span)

    def render(self) -> bytes:
        return self.metrics.render()

    # --- EngineObserver (called on the engine's thread: queue and return) ------------------------
    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None:
        if self._worker is not None:
            self._worker.put(self._queued, request_id, now, prompt_tokens, params, trace_context)

    def request_preempted(self, request_id: str, now: float) -> None:
        if self._worker is not None:
            self._worker.put(self._tracker.request_preempted, request_id, now)

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        if self._worker is not None:
            self._worker.put(self._tracker.step_finished, step, tokens)

    def request_finished(self, record: RequestRecord) -> None:
        if self._worker is not None:
            self._worker.put(self._tracker.request_finished, record)

    def request_rejected(self, reason: str) -> None:
        if self._worker is not None:
            self._worker.put(self._tracker.request_rejected, reason)

    def step_failed(self, cause: str) -> None:
        if self._worker is not None:
            self._worker.put(self.metrics.step_failed, cause)

    def itl_target(self, seconds: float) -> None:
        # set at once, not through the worker (a dict store): shown even with traces and the worker off
        self.metrics.gauges["itl_target_seconds"] = seconds

    def _queued(self, request_id: str, now: float, prompt_tokens: int, params: Any, trace_context: Any) -> None:
        self._tracker.request_queued(request_id, now, prompt_tokens, params, as_request_context(trace_context))

    # --- lifecycle -------------------------------------------------------------------------------
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Process every record queued so far and export the spans it made (blocking; not for the hot path)."""
        if self._worker is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._worker.flush(timeout):
            return False
        if self._provider is None:
            return True
        return _bounded(self._provider.force_flush, None if deadline is None else deadline - time.monotonic())

    def shutdown(self) -> None:
        """Finish open request spans, export what is queued (bounded by shutdown_timeout_s), stop the threads."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.put(self._tracker.close_all, self._clock())
            self._worker.close(self.config.shutdown_timeout_s)
            self._worker = None
        if self._provider is not None:
            self._provider.shutdown()
        self._quiet.detach()


def _bounded(call: Callable[[], bool], timeout: float | None) -> bool:
    """call() on a helper thread, waiting at most timeout (the SDK's force_flush ignores its own)."""
    result: list[bool] = []
    helper = threading.Thread(target=lambda: result.append(call()), name="pagedserve-telemetry-flush",
                              daemon=True)
    helper.start()
    helper.join(None if timeout is None else max(timeout, 0.0))
    return bool(result and result[0])
