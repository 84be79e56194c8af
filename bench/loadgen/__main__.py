"""`python -m bench.loadgen ...`: the load generator on its own, against any OpenAI-compatible server (output
tokens from the server's usage, else counted by text chunks; `pagedserve bench` adds a model's tokenizer)."""

import sys

from bench.loadgen.cli import main

sys.exit(main(prog="python -m bench.loadgen"))
