"""Telemetry: OpenTelemetry traces with per-token timing and inter-token-latency attribution, and Prometheus
metrics, fed by the engine through the thin `telemetry.interface.EngineObserver` interface.

Imports none of the server's other packages: only the standard library, OpenTelemetry and prometheus-client.
The exports load on first use, so the engine importing `telemetry.interface` does not pull in the SDKs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from telemetry.config import TelemetryConfig, TelemetryConfigError
    from telemetry.context import RequestContext, extract_context, traceresponse
    from telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
    from telemetry.observer import Telemetry

__all__ = ["METRICS_CONTENT_TYPE", "RequestContext", "Telemetry", "TelemetryConfig", "TelemetryConfigError",
           "extract_context", "traceresponse"]
_EXPORTS = {
    "Telemetry": ("telemetry.observer", "Telemetry"),
    "TelemetryConfig": ("telemetry.config", "TelemetryConfig"),
    "TelemetryConfigError": ("telemetry.config", "TelemetryConfigError"),
    "RequestContext": ("telemetry.context", "RequestContext"),
    "extract_context": ("telemetry.context", "extract_context"),
    "traceresponse": ("telemetry.context", "traceresponse"),
    "METRICS_CONTENT_TYPE": ("telemetry.metrics", "CONTENT_TYPE"),
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'telemetry' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
