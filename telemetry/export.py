"""Span export: the exporter named in the config, behind a guard that turns every failure into a counted drop.

A collector that is down costs nothing on the request path: spans are queued by the SDK's BatchSpanProcessor
and exported from its thread; when the queue is (nearly) full new spans are shed instead of queued, a failed
export drops its batch, every dropped span is counted (`on_drop`), and one warning is logged per outage (the
exporter's own per-retry log lines are demoted to DEBUG while telemetry runs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from telemetry.config import TelemetryConfig, TelemetryConfigError

log = logging.getLogger("pagedserve.telemetry")
GRPC_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)


def build_exporter(config: TelemetryConfig) -> SpanExporter | None:
    if not config.tracing:
        return None
    if config.exporter == "console":
        return ConsoleSpanExporter(service_name=config.service_name)
    if config.exporter == "otlp-grpc":
        return _grpc_exporter(config)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

    return OTLPSpanExporter(endpoint=config.otlp_traces_url, headers=dict(config.headers),
                            timeout=config.export_timeout_s)


def _grpc_exporter(config: TelemetryConfig) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcExporter,
        )
    except ImportError:
        raise TelemetryConfigError(
            f"telemetry exporter 'otlp-grpc' needs the package {GRPC_PACKAGE}, which is not installed: "
            f"`pip install {GRPC_PACKAGE}`, or use exporter 'otlp-http'") from None
    endpoint = config.otlp_grpc_endpoint
    exporter: SpanExporter = GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"),
                                          headers=tuple(config.headers.items()) or None,
                                          timeout=config.export_timeout_s)
    return exporter


def export_target(config: TelemetryConfig) -> str:
    if config.exporter == "otlp-http":
        return config.otlp_traces_url
    if config.exporter == "otlp-grpc":
        return config.otlp_grpc_endpoint
    return config.exporter


class QuietExporterLogs(logging.Filter):
    """Demotes the exporters' warnings and errors to DEBUG (keeping the last message for our one warning)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_message = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.last_message = record.getMessage()
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True

    def attach(self) -> None:
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self)

    def detach(self) -> None:
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self)


class ExportGuard(SpanExporter):
    """Wraps the real exporter: a failure (result or exception) becomes a counted drop and one warning."""

    def __init__(self, inner: SpanExporter, target: str, on_drop: Callable[[int], None],
                 quiet: QuietExporterLogs) -> None:
        self.inner = inner
        self.target = target
        self.on_drop = on_drop
        self.quiet = quiet
        self.handed = 0  # spans taken from the queue (written by the export thread only)
        self.dropped = 0
        self._failing = False
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.handed += len(spans)
        reason = ""
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # noqa: BLE001 - an exporter bug must not kill the export thread
            result, reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        if result is SpanExportResult.SUCCESS:
            self._failing = False
            return result
        self.drop(len(spans), reason or self.quiet.last_message)
        return result

    def drop(self, count: int, reason: str = "") -> None:
        if count <= 0:
            return
        self.dropped += count
        self.on_drop(count)
        if not self._failing and not self._closed:
            self._failing = True
            log.warning("dropping trace spans for %s%s; dropped spans are counted in "
                        "pagedserve:telemetry_spans_dropped_total (not logged again until an export succeeds)",
                        self.target, f" ({reason})" if reason else "")

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class SheddingBatchProcessor(SpanProcessor):
    """The SDK's BatchSpanProcessor, plus exact drop accounting: spans over the queue's room are shed (and
    counted) here rather than silently displacing older ones inside the SDK."""

    def __init__(self, guard: ExportGuard, config: TelemetryConfig) -> None:
        self.guard = guard
        self.inner = BatchSpanProcessor(guard, max_queue_size=config.max_queue_size,
                                        schedule_delay_millis=config.schedule_delay_s * 1000,
                                        max_export_batch_size=config.max_export_batch_size,
                                        export_timeout_millis=config.export_timeout_s * 1000)
        # room for one batch popped but not yet handed to the guard, so the SDK queue never overflows
        self.room = config.max_queue_size - config.max_export_batch_size
        self.shutdown_timeout_s = config.shutdown_timeout_s
        self.accepted = 0  # written by the telemetry worker thread only

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        if self.accepted - self.guard.handed >= self.room:
            self.guard.drop(1, "export queue full")
            return
        self.accepted += 1
        self.inner.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is queued within shutdown_timeout_s; what is left then is dropped and counted."""
        closer = threading.Thread(target=self.inner.shutdown, name="pagedserve-telemetry-close", daemon=True)
        closer.start()
        closer.join(self.shutdown_timeout_s)
        if closer.is_alive():
            self.guard.shutdown()  # interrupts retries and backoff: the remaining exports fail fast
            closer.join(1.0)
        self.guard.drop(self.accepted - self.guard.handed, "shut down before export")
