"""`pagedserve bench`: the load generator (bench/loadgen, a pure HTTP client with its own flags), with this
project's tokenizer for the servers that send no usage: the one of `--model`, else the installed model's.
service/cli/commands.py names this module and imports it only to run it: the server's packages do not import the
bench."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.model.config import ModelLoadError
from bench.loadgen.cli import EXIT_USAGE
from bench.loadgen.cli import main as run_bench


@dataclass
class LazyTokenCounter:
    """Counts tokens with a GGUF model's tokenizer, opened on first use (only if a server sends no usage)."""

    model: str | None
    _encode: Any = field(default=None, repr=False)

    def __call__(self, text: str) -> int:
        if self._encode is None:
            from backends.model.loader import open_model  # noqa: PLC0415 - opened only if a server sends no usage

            self._encode = open_model(self.model)[1].tokenizer.encode
        return len(self._encode(text))


def main(argv: Sequence[str], prog: str, description: str) -> int:
    try:
        return run_bench(argv, prog, description, open_tokenizer=LazyTokenCounter)
    except ModelLoadError as exc:  # the tokenizer was needed and --model cannot be opened
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
