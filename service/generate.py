"""`pagedserve generate`: one prompt through the offline API; prints only the completion text."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scheduler.params import SamplingParams
from service.assemble import build_llm, build_parts
from service.config_cmd import ConfigCommand, config_from, setup_logging


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    parser.add_argument("--max-tokens", type=int, default=128, metavar="N", help="most tokens to generate "
                                                                                 "(default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default): greedy")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed (default: none)")


def _run(args: argparse.Namespace) -> int:
    config = config_from(args)
    setup_logging("warning")  # stdout carries the completion only
    parts = build_parts(config)
    text = args.prompt
    if args.chat:
        text = parts.files.chat_template.render([{"role": "user", "content": text}])
    params = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    [out] = build_llm(config, parts).generate([parts.files.tokenizer.encode(text)], params)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    print(out.choices[0].text)
    return 0


def main(argv: Sequence[str], prog: str, description: str) -> int:
    return ConfigCommand(_run, _configure).main(argv, prog, description)
