"""`pagedserve generate`: one prompt through the offline API; prints only the completion text."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from backends.model.chat_template import ChatTemplateError
from scheduler.params import SamplingParams
from service.app.assemble import build_llm, build_parts
from service.config.command import ConfigCommand, config_from, setup_logging


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
    tokenizer = parts.files.tokenizer
    if args.chat:  # the template writes any BOS itself
        try:
            ids = tokenizer.encode(parts.files.chat_template.render([{"role": "user", "content": args.prompt}]))
        except ChatTemplateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        ids = tokenizer.encode_prompt(args.prompt)
    params = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    [out] = build_llm(config, parts).generate([ids], params)
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    print(out.choices[0].text)
    return 0


def main(argv: Sequence[str], prog: str, description: str) -> int:
    return ConfigCommand(_run, _configure).main(argv, prog, description)
