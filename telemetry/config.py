"""Telemetry settings: one frozen record, built directly or from the standard OTEL_* environment variables.

Precedence in `from_env`: the environment overrides the `base` record it is given (the service builds `base`
from its config file and applies its command-line flags afterwards with `dataclasses.replace`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

EXPORTERS = ("otlp-http", "otlp-grpc", "console", "none")
DEFAULT_ENDPOINTS = {"otlp-http": "http://localhost:4318", "otlp-grpc": "http://localhost:4317"}
_TRUE = ("1", "true", "yes", "on")


class TelemetryConfigError(ValueError):
    """A telemetry setting is invalid, or the exporter it names cannot be built here."""


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool = True  # False: every observer hook is a no-op (no traces, no metrics)
    exporter: str = "otlp-http"  # traces: "otlp-http" | "otlp-grpc" | "console" | "none" (metrics stay on)
    endpoint: str = ""  # the collector's base URL; "" = the exporter's default (localhost:4318 / :4317)
    traces_endpoint: str = ""  # full URL of the traces endpoint; wins over `endpoint` (OTLP/HTTP)
    headers: Mapping[str, str] = field(default_factory=dict)
    service_name: str = "pagedserve"
    model: str = ""  # gen_ai.request.model when the request's context does not name one
    token_events: str = "all"  # "all" | "every:N" | "none": per-token span events
    step_spans: bool = True  # one llm.engine_step span per step, linked to the requests it served
    slow_token_factor: float = 2.0  # a gap over factor x the request's running median gap is a slow token
    slow_token_min_gaps: int = 3  # gaps seen before a request's tokens are judged
    record_content: bool = False  # prompts and completions go into spans only when True
    export_timeout_s: float = 10.0  # one export request (a down collector costs this, off the hot path)
    schedule_delay_s: float = 1.0  # the batch processor's export interval
    max_queue_size: int = 16384  # ended spans waiting for export; beyond it spans are dropped and counted
    max_export_batch_size: int = 512
    max_span_events: int = 100_000  # long generations keep every token event
    max_span_links: int = 4096  # a step links to every request it served
    max_span_attributes: int = 128
    shutdown_timeout_s: float = 5.0
    max_backlog: int = 1000  # engine records waiting for the worker; beyond it token events are skipped

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise TelemetryConfigError(f"telemetry exporter must be one of {', '.join(EXPORTERS)}, "
                                       f"not {self.exporter!r}")
        token_event_interval(self.token_events)  # raises on a bad value
        _require(self.slow_token_factor > 1.0, "slow_token_factor must be greater than 1")
        _require(self.slow_token_min_gaps >= 1, "slow_token_min_gaps must be at least 1")
        _require(self.export_timeout_s > 0 and self.schedule_delay_s > 0 and self.shutdown_timeout_s > 0,
                 "telemetry timeouts and delays must be positive")
        _require(self.max_export_batch_size >= 1 and self.max_queue_size > self.max_export_batch_size,
                 "max_queue_size must exceed max_export_batch_size (>= 1)")
        _require(min(self.max_span_events, self.max_span_links, self.max_span_attributes, self.max_backlog) >= 1,
                 "span limits must be positive")
        object.__setattr__(self, "headers", dict(self.headers))

    @property
    def token_event_interval(self) -> int:
        """0: no token events; N: every N-th token (1 = all)."""
        return token_event_interval(self.token_events)

    @property
    def tracing(self) -> bool:
        return self.enabled and self.exporter != "none"

    @property
    def otlp_traces_url(self) -> str:
        """Where OTLP/HTTP posts spans: traces_endpoint as given, or endpoint + /v1/traces."""
        if self.traces_endpoint:
            return self.traces_endpoint
        base = self.endpoint or DEFAULT_ENDPOINTS["otlp-http"]
        return base.rstrip("/") + "/v1/traces"

    @property
    def otlp_grpc_endpoint(self) -> str:
        return self.traces_endpoint or self.endpoint or DEFAULT_ENDPOINTS["otlp-grpc"]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, base: TelemetryConfig | None = None
                 ) -> TelemetryConfig:
        env = os.environ if environ is None else environ
        return replace(base or cls(), **_env_overrides(env))


def token_event_interval(spec: str) -> int:
    if spec == "all":
        return 1
    if spec == "none":
        return 0
    prefix, _, count = spec.partition(":")
    if prefix == "every" and count.isdigit() and int(count) >= 1:
        return int(count)
    raise TelemetryConfigError(f"token_events must be 'all', 'none' or 'every:N' (N >= 1), not {spec!r}")


def parse_headers(raw: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS: comma-separated key=value pairs, values URL-encoded."""
    headers = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TelemetryConfigError(f"malformed OTLP header {item!r}: expected key=value")
        headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        out["enabled"] = False
    exporter = _exporter_from_env(env)
    if exporter is not None:
        out["exporter"] = exporter
    _copy(env, out, "OTEL_EXPORTER_OTLP_ENDPOINT", "endpoint")
    _copy(env, out, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "traces_endpoint")
    _copy(env, out, "OTEL_SERVICE_NAME", "service_name")
    headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    if headers:
        out["headers"] = parse_headers(headers)
    timeout = env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    if timeout:  # seconds, as the Python OTLP exporters read it
        out["export_timeout_s"] = _number(timeout, "OTEL_EXPORTER_OTLP_TIMEOUT")
    _copy(env, out, "PAGEDSERVE_TELEMETRY_TOKEN_EVENTS", "token_events")
    _copy(env, out, "PAGEDSERVE_TELEMETRY_MODEL", "model")
    if "PAGEDSERVE_TELEMETRY_SLOW_TOKEN_FACTOR" in env:
        out["slow_token_factor"] = _number(env["PAGEDSERVE_TELEMETRY_SLOW_TOKEN_FACTOR"], "slow_token_factor")
    for flag in ("RECORD_CONTENT", "STEP_SPANS", "ENABLED"):
        if f"PAGEDSERVE_TELEMETRY_{flag}" in env:
            out[flag.lower()] = env[f"PAGEDSERVE_TELEMETRY_{flag}"].strip().lower() in _TRUE
    return out


def _exporter_from_env(env: Mapping[str, str]) -> str | None:
    """OTEL_TRACES_EXPORTER (otlp | console | none) with OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL for otlp."""
    name = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not name:
        return None
    if name in ("console", "none"):
        return name
    if name != "otlp":
        raise TelemetryConfigError(f"OTEL_TRACES_EXPORTER must be otlp, console or none, not {name!r}")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol == "grpc":
        return "otlp-grpc"
    if protocol == "http/protobuf":
        return "otlp-http"
    raise TelemetryConfigError(f"OTLP protocol must be grpc or http/protobuf, not {protocol!r}")


def _copy(env: Mapping[str, str], out: dict[str, Any], name: str, key: str) -> None:
    value = env.get(name, "").strip()
    if value:
        out[key] = value


def _number(raw: str, what: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise TelemetryConfigError(f"{what} must be a number, not {raw!r}") from None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise TelemetryConfigError(message)
