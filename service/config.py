"""The service's own settings and the composed configuration of the whole server."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.config import BackendConfig
from kvpool.config import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.presets import PRESETS

LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A setting is unknown or invalid; the message names it and is meant for the user."""

TRACE_EXPORTERS = ("auto", "otlp-http", "otlp-grpc", "console", "none")

@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the bound address is logged)
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # empty: no auth
    api_key_file: str | None = None  # one key per line; '#' comments and blank lines ignored
    served_model_name: str | None = None  # None: the model's name
    max_body_bytes: int = 2 * 1024 * 1024
    request_timeout_s: float = 600.0
    read_timeout_s: float = 30.0  # request headers, and then the body, must arrive within this (docs/CONFIG.md)
    keepalive_timeout_s: float = 75.0  # an idle kept-alive connection is closed after this (docs/CONFIG.md)
    max_header_bytes: int = 8190  # the request line and each header field
    max_headers: int = 100
    drain_timeout_s: float = 30.0  # on SIGTERM/SIGINT: how long in-flight requests may finish
    step_timeout_s: float = 300.0  # a backend step running longer is a hang: the server fails and exits; 0: off
    tokenizer_threads: int = 2  # threads tokenizing big prompts off the event loop
    max_stream_events_per_s: float = 2000.0  # SSE events/s over all streams; 0: one event per engine output
    log_prompts: bool = False  # prompts and outputs are private unless asked for
    log_level: str = "info"
    preset: str | None = None  # a named set of scheduler settings (service/presets.py); explicit settings win

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes}")
        if self.request_timeout_s <= 0 or min(self.drain_timeout_s, self.max_stream_events_per_s,
                                              self.step_timeout_s) < 0:
            raise ValueError("request_timeout_s must be positive; drain_timeout_s, max_stream_events_per_s and "
                             "step_timeout_s non-negative")
        if self.tokenizer_threads < 1:
            raise ValueError(f"tokenizer_threads must be at least 1, not {self.tokenizer_threads}")
        if min(self.read_timeout_s, self.keepalive_timeout_s) <= 0:
            raise ValueError("read_timeout_s and keepalive_timeout_s must be positive")
        if self.max_header_bytes < 1024 or self.max_headers < 8:
            raise ValueError("max_header_bytes must be at least 1024 and max_headers at least 8")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, not {self.log_level!r}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, not {self.preset!r}")


@dataclass(frozen=True)
class TelemetrySettings:
    """What the server exposes of telemetry's configuration; the standard OTEL_* variables apply too."""

    trace_exporter: str = "auto"  # auto: OTLP/HTTP when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set, else none
    otlp_endpoint: str = ""  # the collector's base URL (e.g. http://collector:4318); implies otlp-http under auto
    token_events: str = "all"  # per-token span events: all | every:N | none
    slow_token_factor: float = 2.0  # a gap over this x the request's median gap is a slow token
    record_content: bool = False  # prompts go into spans only when True

    def __post_init__(self) -> None:
        if self.trace_exporter not in TRACE_EXPORTERS:
            raise ValueError(f"trace_exporter must be one of {TRACE_EXPORTERS}, not {self.trace_exporter!r}")


@dataclass(frozen=True)
class AppConfig:
    service: ServiceConfig = field(default_factory=ServiceConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVPoolConfig = field(default_factory=KVPoolConfig)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
