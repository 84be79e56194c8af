"""TelemetryConfig: validation, the standard OTEL_* variables, exporter construction."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from telemetry import TelemetryConfig, TelemetryConfigError
from telemetry.config import parse_headers
from telemetry.export import build_exporter


def test_defaults() -> None:
    cfg = TelemetryConfig()
    assert cfg.enabled and cfg.exporter == "otlp-http" and cfg.token_events == "all"
    assert cfg.slow_token_factor == 2.0 and cfg.record_content is False
    assert cfg.otlp_traces_url == "http://localhost:4318/v1/traces"
    assert cfg.token_event_interval == 1 and cfg.tracing


@pytest.mark.parametrize(("spec", "interval"), [("all", 1), ("none", 0), ("every:1", 1), ("every:16", 16)])
def test_token_events(spec: str, interval: int) -> None:
    assert TelemetryConfig(token_events=spec).token_event_interval == interval


@pytest.mark.parametrize("bad", [
    {"exporter": "zipkin"}, {"token_events": "every:0"}, {"token_events": "some"}, {"token_events": "every:x"},
    {"slow_token_factor": 1.0}, {"max_queue_size": 10, "max_export_batch_size": 10}, {"export_timeout_s": 0},
])
def test_invalid_settings_raise(bad: dict[str, object]) -> None:
    with pytest.raises(TelemetryConfigError):
        TelemetryConfig(**bad)  # type: ignore[arg-type]


def test_standard_environment_variables() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc,x-team = infra",
        "OTEL_SERVICE_NAME": "edge-llm",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
        "PAGEDSERVE_TELEMETRY_TOKEN_EVENTS": "every:4",
        "PAGEDSERVE_TELEMETRY_RECORD_CONTENT": "true",
    }
    cfg = TelemetryConfig.from_env(env, base=TelemetryConfig(model="m"))
    assert cfg.otlp_traces_url == "http://collector:4318/v1/traces"
    assert cfg.headers == {"authorization": "Bearer abc", "x-team": "infra"}
    assert cfg.service_name == "edge-llm" and cfg.export_timeout_s == 3.0
    assert cfg.token_events == "every:4" and cfg.record_content and cfg.model == "m"
    traces = TelemetryConfig.from_env({**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"})
    assert traces.otlp_traces_url == "http://t:9/x"
    assert TelemetryConfig.from_env({}) == TelemetryConfig()


@pytest.mark.parametrize(("env", "exporter", "enabled"), [
    ({"OTEL_TRACES_EXPORTER": "none"}, "none", True),
    ({"OTEL_TRACES_EXPORTER": "console"}, "console", True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "otlp-grpc", True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "otlp-http", True),
    ({"OTEL_SDK_DISABLED": "true"}, "otlp-http", False),
])
def test_exporter_from_environment(env: dict[str, str], exporter: str, enabled: bool) -> None:
    cfg = TelemetryConfig.from_env(env)
    assert cfg.exporter == exporter and cfg.enabled is enabled


def test_bad_environment_raises() -> None:
    with pytest.raises(TelemetryConfigError):
        TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "jaeger"})
    with pytest.raises(TelemetryConfigError):
        TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(TelemetryConfigError):
        parse_headers("novalue")


def test_build_exporter() -> None:
    assert isinstance(build_exporter(TelemetryConfig()), OTLPSpanExporter)
    assert isinstance(build_exporter(TelemetryConfig(exporter="console")), ConsoleSpanExporter)
    assert build_exporter(TelemetryConfig(exporter="none")) is None
    assert build_exporter(TelemetryConfig(enabled=False)) is None


def test_grpc_without_its_package_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail, whether or not the gRPC exporter is installed here
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(TelemetryConfigError, match="opentelemetry-exporter-otlp-proto-grpc"):
        build_exporter(TelemetryConfig(exporter="otlp-grpc"))
