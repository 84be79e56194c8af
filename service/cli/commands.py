"""The `pagedserve` command. Subcommands are registered in `commands()`, the one place to add one.

Each subcommand owns its parser, so it takes only its own flags, and a usage error (an unknown flag, a bad
value) shows its own usage. Its module is named here and imported only when it runs: `serve` loads nothing of
the load generator, `bench` nothing of the server, and the server's packages never import the bench
(tests/test_import_rules.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    module: str  # defines main(argv, prog, description) -> exit status, argv being what follows the name

    def main(self, argv: Sequence[str]) -> int:
        entry = importlib.import_module(self.module).main
        return int(entry(list(argv), f"pagedserve {self.name}", self.help))


def commands() -> tuple[Command, ...]:
    return (
        Command("serve", "serve the OpenAI-compatible HTTP API", "service.app.server"),
        Command("generate", "complete one prompt offline and print the text", "service.cli.generate"),
        Command("bench", "benchmark an OpenAI-compatible server (streaming load, latency percentiles, sweeps)",
                "bench.bench_cmd"),
    )


def build_parser(cmds: Iterable[Command]) -> argparse.ArgumentParser:
    """The top level only names the command; the command's own parser reads the rest."""
    parser = argparse.ArgumentParser(prog="pagedserve", description="OpenAI-compatible LLM inference server",
                                     epilog="'pagedserve COMMAND --help' lists the command's flags.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in cmds:
        sub.add_parser(cmd.name, help=cmd.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = {c.name: c for c in commands()}
    name = build_parser(cmds.values()).parse_args(argv[:1]).command
    try:
        return cmds[name].main(argv[1:])
    except KeyboardInterrupt:
        return 130
