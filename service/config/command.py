"""A command configured like the server (`serve`, `generate`): its own options, a flag for every setting of
service/config/settings.py, and the process's log. A failure before it starts (a bad setting, a model that cannot be
loaded) is one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from backends.base import BackendError
from backends.model.config import ModelLoadError
from scheduler.errors import SchedulerError
from service.config.setting_docs import doc_of
from service.config.settings import AppConfig, ConfigError, Setting, all_settings, describe, load_config, parse_text
from service.config.settings_table import default_text, values_text

EXIT_USAGE = 2  # also for a model that cannot be loaded
EPILOG = "Every setting also reads PAGEDSERVE_<NAME> and the [section] tables of --config FILE (docs/CONFIG.md)."
_FLAG_DEST = "setting:"


@dataclass(frozen=True)
class ConfigCommand:
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None  # the command's own options

    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=prog, description=description, epilog=EPILOG)
        self._add_own(parser)
        parser.usage = self._usage(prog)
        add_config_flags(parser)
        return parser

    def _add_own(self, parser: argparse.ArgumentParser) -> None:
        if self.configure is not None:
            self.configure(parser)

    def _usage(self, prog: str) -> str:
        """The command's own options, then the settings in one: every one of them would fill a screen."""
        own = argparse.ArgumentParser(prog=prog)
        self._add_own(own)
        return own.format_usage().removeprefix("usage: ").strip() + " [--config FILE] [--SETTING VALUE ...]"

    def main(self, argv: Sequence[str], prog: str, description: str) -> int:
        args = self.parser(prog, description).parse_args(argv)
        try:
            return int(self.run(args))
        except (ConfigError, ModelLoadError, BackendError, SchedulerError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)  # one clear line, no traceback
            return EXIT_USAGE


def config_from(args: argparse.Namespace) -> AppConfig:
    return load_config(args.config, os.environ, flags_of(args))


def setup_logging(level: str) -> None:
    """Records of `level` and above on stderr, one line each."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, its help from the setting's words. A value of the wrong type or outside the
    setting's choices is a usage error of the command; only flags actually given reach `load_config` (the rest
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
    doc = doc_of(setting)
    values = "" if doc.choices or not (doc.values or setting.optional) else f"; {values_text(setting)}"
    text = f"{doc.text}{values} [default: {default_text(setting)}]"
    return text.replace("%", "%%")  # argparse formats help with %


def _metavar(setting: Setting) -> str:
    choices = doc_of(setting).choices
    if not choices:
        return {"strs": "STR", "auto_float": "auto|FLOAT"}.get(setting.kind, setting.kind.upper())
    return "{" + ",".join(choices + (("none",) if setting.optional else ())) + "}"


def _checked(setting: Setting) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            value = parse_text(setting, text, setting.flag)
        except ConfigError:
            raise argparse.ArgumentTypeError(f"expected {describe(setting)}, got {text!r}") from None
        allowed = doc_of(setting).choices
        if allowed and value not in (*allowed, None, setting.default):
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text

    return check


def flags_of(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings' flags given, by setting name, as `load_config` takes them."""
    return {k[len(_FLAG_DEST):]: v for k, v in vars(namespace).items() if k.startswith(_FLAG_DEST)}
