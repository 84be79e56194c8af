"""A command configured like the server (`serve`, `generate`): its own options and a flag for every setting.
A failure before it starts (a bad setting, a model that cannot be loaded) is one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.base import BackendError
from backends.model.config import ModelLoadError
from scheduler.errors import SchedulerError
from service.config import AppConfig, ConfigError
from service.config_load import add_config_flags, flags_of, load_config

EXIT_USAGE = 2  # also for a model that cannot be loaded
EPILOG = "Every setting also reads PAGEDSERVE_<NAME> and the [section] tables of --config FILE (docs/CONFIG.md)."


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
