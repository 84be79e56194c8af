"""The table of every setting: its section, key, value kind, default, command-line flag, environment variable
and what it means (service/setting_docs.py).

Built from the config dataclasses themselves, so a field added to any section is configurable everywhere at
once (and a test asks for its words). Public names are the field names (unique across sections), except
`backend.name`, which is `backend`, and `service.api_keys`, which is `api_key` (a flag given once per key).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from backends.config import BackendConfig
from kvpool.config import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config import ConfigError, ServiceConfig, TelemetrySettings
from service.setting_docs import DOCS, SettingDoc

SECTIONS: dict[str, type] = {
    "service": ServiceConfig,
    "backend": BackendConfig,
    "scheduler": SchedulerConfig,
    "kv": KVPoolConfig,
    "telemetry": TelemetrySettings,
}
ENV_PREFIX = "PAGEDSERVE_"
_RENAMED = {("backend", "name"): "backend", ("service", "api_keys"): "api_key"}
_KINDS = {int: "int", float: "float", str: "str", bool: "bool"}
_KIND_WORDS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "strs": "list of str"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    kind: str  # int | float | str | bool | strs
    optional: bool  # None is a valid value
    default: Any
    doc: SettingDoc

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
    kind = "strs" if typing.get_origin(base) is tuple else _KINDS[base]
    doc = DOCS.get(f"{section}.{key}", SettingDoc(""))  # none yet: a test names the setting
    return Setting(section, key, kind, optional, default, doc)


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
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "strs": isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[setting.kind]
    if not ok:
        raise ConfigError(f"{origin}: expected {describe(setting)}, got {value!r}")
    if setting.kind == "float":
        return float(value)
    return tuple(value) if setting.kind == "strs" else value


def describe(setting: Setting) -> str:
    text = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
            "strs": "a list of strings"}[setting.kind]
    return text + (" (or none)" if setting.optional else "")


def value_text(value: Any) -> str:
    """A value as a person would write it in the file or a flag; "none" for unset."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None or value in ("", ()):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return ", ".join(value) if isinstance(value, tuple) else str(value)


def values_text(setting: Setting) -> str:
    """The values a setting takes, in words: its choices, else the doc's words, else its kind."""
    if setting.doc.choices:
        return ", ".join(setting.doc.choices) + (" or none" if setting.optional else "")
    if setting.doc.values:
        return setting.doc.values
    return _KIND_WORDS[setting.kind] + (" or none" if setting.optional else "")


def default_text(setting: Setting) -> str:
    return setting.doc.default.replace("`", "") or value_text(setting.default)
