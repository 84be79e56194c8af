"""The `pagedserve` command. Subcommands are registered in `commands()`, the one place to add one."""

from __future__ import annotations

import argparse
import logging
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


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def commands() -> tuple[Command, ...]:
    """Every subcommand (the benchmark adds `bench` here)."""
    from bench.loadgen.cli import BENCH  # noqa: PLC0415
    from service.generate import GENERATE  # noqa: PLC0415  (each command imports its own heavy parts)
    from service.serve_cmd import SERVE  # noqa: PLC0415

    return (SERVE, GENERATE, BENCH)


def config_from(args: argparse.Namespace) -> AppConfig:
    return load_config(args.config, os.environ, flags_of(args))


def build_parser(cmds: Sequence[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedserve", description="OpenAI-compatible LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in cmds:
        child = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(child)
        add_config_flags(child)
        child.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(commands()).parse_args(argv)
    try:
        return int(args.run(args))
    except (ConfigError, ModelLoadError, BackendError, SchedulerError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # one clear line, no traceback
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
