"""Compose an AppConfig from defaults, a TOML file, PAGEDSERVE_* environment variables and command-line
flags, in that order of increasing precedence. Every unknown key is an error that names it."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.config import AppConfig, ConfigError
from service.presets import PRESETS
from service.settings import (
    ENV_PREFIX,
    SECTIONS,
    Setting,
    all_settings,
    check_value,
    default_text,
    describe,
    parse_text,
    values_text,
)

CONFIG_ENV = ENV_PREFIX + "CONFIG"  # names the config file when --config is not given
SHORTCUTS = {"backend": ("backend", "name"), "model": ("backend", "model")}  # top-level keys of the file
_FLAG_DEST = "setting:"

Values = dict[tuple[str, str], Any]  # (section, key) -> value


def load_config(config_file: str | None = None, env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> AppConfig:
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


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, its help from the setting's words. A value of the wrong type or outside the
    setting's choices is a usage error of the command; only flags actually given reach `read_flags` (the rest
    are suppressed), as the text given, so a flag reads exactly as the same text in the environment."""
    group = parser.add_argument_group(
        "configuration (flags > PAGEDSERVE_* env > --config file > defaults; see docs/CONFIG.md)")
    group.add_argument("--config", metavar="FILE", help="TOML config file (or PAGEDSERVE_CONFIG)")
    for s in all_settings():
        kwargs: dict[str, Any] = {"dest": _FLAG_DEST + s.name, "default": argparse.SUPPRESS, "help": flag_help(s)}
        if s.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=_checked(s), metavar=_metavar(s))
            if s.kind == "strs":
                kwargs["action"] = "append"
        group.add_argument(s.flag, **kwargs)


def flag_help(setting: Setting) -> str:
    """What it does, its values where the metavar does not show them, and its default."""
    doc = setting.doc
    values = "" if doc.choices or not (doc.values or setting.optional) else f"; {values_text(setting)}"
    text = f"{doc.text}{values} [default: {default_text(setting)}]"
    return text.replace("%", "%%")  # argparse formats help with %


def _metavar(setting: Setting) -> str:
    choices = setting.doc.choices + (("none",) if setting.optional else ())
    return "{" + ",".join(choices) + "}" if setting.doc.choices else setting.kind.upper().replace("STRS", "STR")


def _checked(setting: Setting) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            value = parse_text(setting, text, setting.flag)
        except ConfigError:
            raise argparse.ArgumentTypeError(f"expected {describe(setting)}, got {text!r}") from None
        allowed = setting.doc.choices
        if allowed and value not in (*allowed, None, setting.default):
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text

    return check


def flags_of(namespace: argparse.Namespace) -> dict[str, Any]:
    return {k[len(_FLAG_DEST):]: v for k, v in vars(namespace).items() if k.startswith(_FLAG_DEST)}


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
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        kwargs = {key: v for (section, key), v in values.items() if section == name}
        try:
            sections[name] = cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"invalid [{name}] setting: {exc}") from None
    return AppConfig(**sections)
