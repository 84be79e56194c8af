"""The server's configuration: AppConfig, and how it is composed.

AppConfig holds one frozen section per package, each checking its own values: [service] and [telemetry] here,
[backend] in backends/config.py, [scheduler] in scheduler/config.py, [kv] in kvpool/config.py. `load_config`
composes it from five layers, each over the ones before it:

1. the sections' defaults;
2. the named preset's scheduler settings (PRESETS; `preset` is itself a setting, from any layer below);
3. the TOML file: --config FILE, else the file PAGEDSERVE_CONFIG names;
4. PAGEDSERVE_* environment variables;
5. command-line flags, one per setting (service/config/command.py).

Every setting is a field of a section, named by the field (unique across sections; `backend.name` is `backend`,
`service.api_keys` is `api_key`), which also names its flag and its variable (`Setting`). An unknown key,
variable or flag is an error that names it. What each setting means, in words, is in service/config/setting_docs.py;
docs/CONFIG.md has the table.

Telemetry's own configuration is composed when the server starts, from [telemetry] and the standard OTEL_*
variables (`telemetry_config`).
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from backends.config import BackendConfig
from kvpool.config import KVPoolConfig
from scheduler.config import AUTO, SchedulerConfig, SpeculativeConfig
from scheduler.step_health import HealthLimits
from telemetry import TelemetryConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
TRACE_EXPORTERS = ("auto", "otlp-http", "otlp-grpc", "console", "none")
ANY_ORIGIN = "*"  # cors_allow_origins: any origin, never with credentials (service/http/middleware.py)
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?")

# Named scheduler presets. The values come from the frontier experiment in docs/PERFORMANCE.md
# ("Experiments"): `latency` for interactive chat (lowest p99 time to first token at a moderate load, with short
# steps), `throughput` for batch jobs (the most output tokens per second under a saturating load).
# `itl_target_ms` comes from the itl-target experiment: 50 ms keeps a chat's stream steady while prompts are
# prefilled beside it; a batch job does not watch its streams, so prefill takes the whole budget (0, off) and
# the CPU's largest, most efficient steps. Both stay numbers rather than the default "auto": auto trades the
# stalls for TTFT and throughput as the host's speed asks (at most 10 % of the throughput), where each preset
# has already chosen its side of that trade.
PRESETS: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "latency": MappingProxyType({"max_num_seqs": 32, "max_num_batched_tokens": 2048, "itl_target_ms": 50}),
    "throughput": MappingProxyType({"max_num_seqs": 256, "max_num_batched_tokens": 8192, "itl_target_ms": 0}),
})


class ConfigError(ValueError):
    """A setting is unknown or invalid; the message names it and is meant for the user."""


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the bound address is logged)
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # empty: no auth
    api_key_file: str | None = None  # one key per line; '#' comments and blank lines ignored
    served_model_name: tuple[str, ...] = ()  # the API's names for the model, the first reported; (): its own
    max_body_bytes: int = 2 * 1024 * 1024
    request_timeout_s: float = 600.0
    read_timeout_s: float = 30.0  # request headers, and then the body, must arrive within this (docs/CONFIG.md)
    keepalive_timeout_s: float = 75.0  # an idle kept-alive connection is closed after this (docs/CONFIG.md)
    max_header_bytes: int = 8190  # the request line and each header field
    max_headers: int = 100
    drain_timeout_s: float = 30.0  # on SIGTERM/SIGINT: how long in-flight requests may finish
    step_timeout_s: float = 300.0  # a backend step running longer is a hang: the server fails and exits; 0: off
    tokenizer_threads: int = 2  # threads rendering and tokenizing prompts off the event loop
    tokenizer_queue: int = 64  # prompts waiting for or on those threads; more are refused with 503 (Retry-After)
    max_messages: int = 2048  # a chat request's messages; more are refused with 400 before anything is rendered
    max_tools: int = 128  # a request's tools (OpenAI's limit); more are refused with 400, as above
    max_tool_bytes: int = 256 * 1024  # a request's tool definitions as JSON, all together
    # /health answers 503 "degraded" while at least half the engine steps that ended in the last health_window_s
    # failed (and at least 3 did), and while a step runs past stall_report_s and 10x its predicted time.
    health_window_s: float = 30.0
    health_failure_rate: float = 0.5
    stall_report_s: float = 5.0
    max_stream_events_per_s: float = 2000.0  # SSE events/s over all streams; 0: one event per engine output
    log_prompts: bool = False  # prompts and outputs are private unless asked for
    log_level: str = "info"
    preset: str | None = None  # one of PRESETS, applied under every setting given explicitly
    cors_allow_origins: tuple[str, ...] = ()  # empty: no CORS headers; "*": any origin, never with credentials
    dashboard: bool = True  # GET /dashboard, the live view of the engine, and its feed GET /dashboard/events

    @property
    def health(self) -> HealthLimits:
        return HealthLimits(self.health_window_s, self.health_failure_rate, stall_floor_s=self.stall_report_s)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes}")
        if self.request_timeout_s <= 0 or min(self.drain_timeout_s, self.max_stream_events_per_s,
                                              self.step_timeout_s) < 0:
            raise ValueError("request_timeout_s must be positive; drain_timeout_s, max_stream_events_per_s and "
                             "step_timeout_s non-negative")
        if min(self.tokenizer_threads, self.tokenizer_queue, self.max_messages, self.max_tools,
               self.max_tool_bytes) < 1:
            raise ValueError("tokenizer_threads, tokenizer_queue, max_messages, max_tools and max_tool_bytes must "
                             "be at least 1")
        _ = self.health  # HealthLimits checks its own values
        if min(self.read_timeout_s, self.keepalive_timeout_s) <= 0:
            raise ValueError("read_timeout_s and keepalive_timeout_s must be positive")
        if self.max_header_bytes < 1024 or self.max_headers < 8:
            raise ValueError("max_header_bytes must be at least 1024 and max_headers at least 8")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, not {self.log_level!r}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, not {self.preset!r}")
        check_origins(self.cors_allow_origins)


def check_origins(origins: tuple[str, ...]) -> None:
    """ValueError unless each is "*" or scheme://host[:port] (no path, no trailing slash)."""
    bad = [o for o in origins if o != ANY_ORIGIN and not _ORIGIN.fullmatch(o)]
    if bad:
        raise ValueError(f"cors_allow_origins: {bad[0]!r} is not \"*\" or an origin like https://host[:port]")


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
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)


SECTIONS: Mapping[str, type] = MappingProxyType(typing.get_type_hints(AppConfig))  # [name] -> its class, in order
ENV_PREFIX = "PAGEDSERVE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"  # names the config file when --config is not given
SHORTCUTS = {"backend": ("backend", "name"), "model": ("backend", "model")}  # top-level keys of the file

Values = dict[tuple[str, str], Any]  # (section, key) -> value


def load_config(config_file: str | None = None, env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> AppConfig:
    """The five layers in order; `flags` maps a setting's name to its flag's value as given."""
    env = env or {}
    settings = all_settings()
    values: Values = {}
    path = config_file or env.get(CONFIG_ENV)
    if path:
        values.update(read_file(Path(path), settings))
    values.update(read_env(env, settings))
    values.update(read_flags(flags or {}, settings))
    return build({**preset_values(values.get(("service", "preset"))), **values})


def preset_values(name: str | None) -> Values:
    """A preset's scheduler settings: the layer just above the defaults, under every explicit setting."""
    if name is None:
        return {}
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return {("scheduler", key): value for key, value in PRESETS[name].items()}


def read_file(path: Path, settings: tuple[Setting, ...]) -> Values:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    by_key = {(s.section, s.key): s for s in settings}
    values: Values = {}
    for name, value in data.items():
        if name in SHORTCUTS:
            values[SHORTCUTS[name]] = check_value(by_key[SHORTCUTS[name]], value, f"{path}: '{name}'")
        elif name in SECTIONS and isinstance(value, dict):
            values.update(_read_section(path, name, value, by_key))
        else:
            raise ConfigError(f"{path}: unknown key '{name}' (sections: {', '.join(SECTIONS)}; "
                              f"top-level keys: {', '.join(SHORTCUTS)})")
    return values


def _read_section(path: Path, section: str, table: dict[str, Any],
                  by_key: dict[tuple[str, str], Setting]) -> Values:
    values: Values = {}
    for key, value in table.items():
        setting = by_key.get((section, key))
        if setting is None:
            raise ConfigError(f"{path}: unknown key '{key}' in [{section}]")
        values[(section, key)] = check_value(setting, value, f"{path}: [{section}] {key}")
    return values


def read_env(env: Mapping[str, str], settings: tuple[Setting, ...]) -> Values:
    by_env = {s.env: s for s in settings}
    values: Values = {}
    for var, text in env.items():
        if not var.startswith(ENV_PREFIX) or var == CONFIG_ENV:
            continue
        setting = by_env.get(var)
        if setting is None:
            raise ConfigError(f"unknown environment variable {var} (no such setting)")
        values[(setting.section, setting.key)] = parse_text(setting, text, var)
    return values


def read_flags(flags: Mapping[str, Any], settings: tuple[Setting, ...]) -> Values:
    by_name = {s.name: s for s in settings}
    values: Values = {}
    for name, raw in flags.items():
        setting = by_name.get(name)
        if setting is None:
            raise ConfigError(f"unknown flag --{name.replace('_', '-')}")
        values[(setting.section, setting.key)] = _flag_value(setting, raw)
    return values


def _flag_value(setting: Setting, raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, list):  # an append flag: each occurrence may itself be a comma list
        return tuple(v for item in raw for v in parse_text(setting, item, setting.flag))
    return parse_text(setting, str(raw), setting.flag)


def build(values: Values) -> AppConfig:
    """Each section from its values (defaults for the rest); a section refusing its values names them."""
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        kwargs = {key: v for (section, key), v in values.items() if section == name}
        try:
            sections[name] = cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid [{name}] setting: {exc}") from None
    return AppConfig(**sections)


# Each setting: a row per field of every section.

_RENAMED = {("backend", "name"): "backend", ("service", "api_keys"): "api_key"}  # the api_key flag: once per key
_KINDS = {int: "int", float: "float", str: "str", bool: "bool"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    kind: str  # int | float | str | bool | strs
    optional: bool  # None is a valid value
    default: Any

    @property
    def path(self) -> str:
        """As in the config file and in service/config/setting_docs.py: "section.key"."""
        return f"{self.section}.{self.key}"

    @property
    def name(self) -> str:
        return _RENAMED.get((self.section, self.key), self.key)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def all_settings() -> tuple[Setting, ...]:
    """Built from the sections themselves, so a field added to any of them is configurable everywhere at once."""
    found = [_setting(section, key, hint, default) for section, cls in SECTIONS.items()
             for key, hint, default in _fields(cls)]
    names = [s.name for s in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:  # a bug in a config dataclass, caught by the test suite
        raise ConfigError(f"settings share a name across sections: {', '.join(duplicates)}")
    return tuple(found)


def _fields(cls: type) -> list[tuple[str, Any, Any]]:
    """Each field's name, type and default (every section builds with no arguments)."""
    hints, defaults = typing.get_type_hints(cls), cls()
    return [(f.name, hints[f.name], getattr(defaults, f.name)) for f in dataclasses.fields(cls)]


def _setting(section: str, key: str, hint: Any, default: Any) -> Setting:
    args = typing.get_args(hint)
    optional = isinstance(hint, types.UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else hint
    return Setting(section, key, _kind(base), optional, default)


def _kind(base: Any) -> str:
    if typing.get_origin(base) is tuple:
        return "strs"
    if base == float | typing.Literal["auto"]:  # a number, or "auto": derived when the server starts
        return "auto_float"
    return _KINDS[base]


def parse_text(setting: Setting, text: str, origin: str) -> Any:
    """A value given as text (environment variable or flag)."""
    stripped = text.strip()
    if setting.optional and stripped.lower() in ("", "none"):
        return None
    try:
        return _from_text(setting.kind, stripped)
    except ValueError:
        raise ConfigError(f"{origin}: expected {describe(setting)}, got {text!r}") from None


def _from_text(kind: str, text: str) -> Any:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "auto_float":
        return AUTO if text.lower() == AUTO else float(text)
    if kind == "bool":
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ValueError(text)
    if kind == "strs":
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return text


def check_value(setting: Setting, value: Any, origin: str) -> Any:
    """A value from the config file, whose types TOML already decoded."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "auto_float": value == AUTO or (isinstance(value, int | float) and not isinstance(value, bool)),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "strs": isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }[setting.kind]
    if not ok:
        raise ConfigError(f"{origin}: expected {describe(setting)}, got {value!r}")
    if setting.kind == "float" or (setting.kind == "auto_float" and value != AUTO):
        return float(value)
    if setting.kind == "strs":  # a list, or one string read as the same text would be in a flag
        return _from_text("strs", value) if isinstance(value, str) else tuple(value)
    return value


def describe(setting: Setting) -> str:
    text = {"int": "an integer", "float": "a number", "auto_float": f"{AUTO} or a number", "str": "a string",
            "bool": "true or false", "strs": "a list of strings"}[setting.kind]
    return text + (" (or none)" if setting.optional else "")


# Telemetry's configuration, at start-up.

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def telemetry_config(settings: TelemetrySettings, model: str, environ: Mapping[str, str]) -> TelemetryConfig:
    """[telemetry] over the OTEL_* variables. Traces go out only when a collector is named (no endpoint under
    "auto": metrics only)."""
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
