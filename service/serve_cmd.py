"""`pagedserve serve`: the HTTP server on uvloop."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

import uvloop

from backends.base import BackendError
from backends.model.loader import open_model
from backends.registry import available
from service.assemble import build_runtime
from service.auth import load_keys
from service.config_cmd import ConfigCommand, config_from
from service.log_setup import setup_logging


def _run(args: argparse.Namespace) -> int:
    from service.server import serve  # noqa: PLC0415

    config = config_from(args)
    load_keys(config.service)  # an unreadable key file fails here, before the port is taken
    # A missing, non-GGUF or unsupported model fails here too (one line, exit 2); the weights load later,
    # in the background, while /health answers 503.
    _, files = open_model(config.backend.model)
    _check_backend(config.backend.name)
    setup_logging(config.service.log_level)
    build = functools.partial(build_runtime, files=files)
    return uvloop.run(serve(config, build, announce=lambda line: print(line, file=sys.stderr, flush=True)))


def _check_backend(name: str) -> None:
    known = available()
    if name not in known:
        raise BackendError(f"unknown backend '{name}' (available: {', '.join(sorted(known))})")


def main(argv: Sequence[str], prog: str, description: str) -> int:
    return ConfigCommand(_run).main(argv, prog, description)  # every flag of serve is a setting
