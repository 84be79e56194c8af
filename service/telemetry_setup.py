"""Compose telemetry's configuration from the server's [telemetry] settings and the standard OTEL_* variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from service.config import TelemetrySettings
from telemetry import TelemetryConfig

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def telemetry_config(settings: TelemetrySettings, model: str, environ: Mapping[str, str]) -> TelemetryConfig:
    """Traces go out only when a collector is named (no endpoint under "auto": metrics only)."""
    otel = {k: v for k, v in environ.items() if k.startswith("OTEL_")}  # PAGEDSERVE_* are the server's own
    exporter = settings.trace_exporter
    if exporter == "auto":
        named = settings.otlp_endpoint or any(otel.get(v) for v in _ENDPOINT_VARS)
        exporter = "otlp-http" if named else "none"
    base = TelemetryConfig(exporter=exporter, token_events=settings.token_events,
                           slow_token_factor=settings.slow_token_factor, record_content=settings.record_content,
                           model=model)
    config = TelemetryConfig.from_env(otel, base=base)
    # the server's own setting wins over the environment's
    return replace(config, endpoint=settings.otlp_endpoint) if settings.otlp_endpoint else config
