"""Speculative decoding (prompt lookup) against none, on the served configuration's engine and the real model.

    python -m bench.speculative [--rounds 3] [--max-tokens 128] [--streams 16] [--num-speculative-tokens 4]
                                [--ngram-max 4] [--cpu-precision exact] [--rows]

The prompts are committed (bench/data/speculative.json): `quote`, tasks whose answers repeat long spans of the
prompt (corrections, rewrites, renames, summaries that quote), and `chat`, questions whose answers do not. Each
is one user message in the model's chat template, answered greedily up to --max-tokens.

The two arms, speculation off and `ngram`, take turns in every round on one engine's backend and KV pool (its
prefix cache emptied before each arm), so drift in the host's speed reaches both alike. Measured per arm:

- quote and chat, one stream at a time: TPOT (first token to last, over the tokens after the first), per prompt,
  reported as the median over prompts and rounds; and output tokens per second over each arm's whole pass;
- chat, --streams at once: output tokens per second, every prompt admitted together;
- the acceptance rate (tokens kept / tokens guessed) and the guessed tokens per verified step.

Greedy answers must be the same token for token in both arms (checked every round; exact precision: the
kernels' rows are independent, so this holds by construction; fast: a row's 8-bit activations depend on its
step's shape, as with batching). --rows first prints a verify step's cost by its rows (one sequence at 300
tokens, 1..k+1 query rows): the price of a guess on this host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from backends.manual_batch import SeqState, greedy, make_batch
from backends.numpy_backend.backend import NumpyBackend
from scheduler.config import SpeculativeConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from service.app.assemble import ModelParts, build_parts
from service.config.settings import AppConfig, load_config

DATA = Path(__file__).parent / "data" / "speculative.json"


@dataclass
class Arm:
    """One arm's samples over all rounds."""

    name: str
    tpot_ms: dict[str, list[float]] = field(default_factory=lambda: {"quote": [], "chat": []})
    single_tps: dict[str, list[float]] = field(default_factory=lambda: {"quote": [], "chat": []})
    multi_tps: list[float] = field(default_factory=list)
    guessed: int = 0
    kept: int = 0
    verified_steps: int = 0
    guessed_together: int = 0  # of them, while --streams ran at once


def main() -> None:
    args = parse_args()
    config = load_config(None, {}, {"cpu_precision": args.cpu_precision})
    parts = build_parts(config)
    if args.rows:
        verify_rows(parts, args.num_speculative_tokens + 1)
    prompts = encoded(parts)
    on = replace(config, speculative=SpeculativeConfig("ngram", args.num_speculative_tokens, args.ngram_max))
    arms = {"off": (config, Arm("off")), "ngram": (on, Arm("ngram"))}
    for round_no in range(args.rounds):
        answers = {name: one_round(conf, parts, prompts, arm, args) for name, (conf, arm) in arms.items()}
        same = answers["off"] == answers["ngram"]
        print(f"round {round_no + 1}: greedy answers identical in both arms: {'yes' if same else 'NO'}")
    report([arm for _, arm in arms.values()], args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=16, help="chat prompts at once (0: skip)")
    parser.add_argument("--num-speculative-tokens", type=int, default=SpeculativeConfig.num_speculative_tokens)
    parser.add_argument("--ngram-max", type=int, default=SpeculativeConfig.ngram_max)
    parser.add_argument("--cpu-precision", default="exact", choices=("exact", "fast"))
    parser.add_argument("--rows", action="store_true", help="first, a verify step's cost by its rows")
    return parser.parse_args()


def encoded(parts: ModelParts) -> dict[str, list[list[int]]]:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    template, tokenizer = parts.files.chat_template, parts.files.tokenizer
    return {kind: [tokenizer.encode(template.render([{"role": "user", "content": text}])) for text in data[kind]]
            for kind in ("quote", "chat")}


def one_round(config: AppConfig, parts: ModelParts, prompts: dict[str, list[list[int]]], arm: Arm,
              args: argparse.Namespace) -> list[list[int]]:
    """Every prompt alone, then the chat prompts together; returns the single-stream answers."""
    llm = LLM(config.scheduler, parts.kv, parts.backend, parts.files.tokenizer, max_model_len=parts.max_model_len,
              speculative=config.speculative)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    answers = []
    for kind in ("quote", "chat"):
        tokens, start = 0, time.perf_counter()
        for prompt in prompts[kind]:
            answer, tpot = alone(llm, parts, prompt, params)
            answers.append(answer)
            arm.tpot_ms[kind].append(1e3 * tpot)
            tokens += len(answer)
        arm.single_tps[kind].append(tokens / (time.perf_counter() - start))
    speculator = llm.core.scheduler.speculator
    alone_guessed = 0 if speculator is None else speculator.counters.proposed
    if args.streams:
        arm.multi_tps.append(together(llm, parts, (prompts["chat"] * args.streams)[: args.streams], params))
    if speculator is not None:
        arm.guessed_together += speculator.counters.proposed - alone_guessed
        counters = speculator.counters
        arm.guessed, arm.kept = arm.guessed + counters.proposed, arm.kept + counters.accepted
        arm.verified_steps += counters.steps
    return answers


def alone(llm: LLM, parts: ModelParts, prompt: list[int], params: SamplingParams) -> tuple[list[int], float]:
    """One request on an idle engine: its tokens and its TPOT (s)."""
    parts.kv.reset_prefix_cache()
    core = llm.core
    stream = core.add_request(EngineRequest(f"bench-{time.monotonic_ns()}", tuple(prompt), params))
    state = next(iter(core.requests.values()))
    llm.run_until_idle()
    end = time.monotonic()
    output = stream.take_finished()
    tokens = output.choices[0].token_ids
    assert state.first_token is not None
    return tokens, (end - state.first_token) / max(1, len(tokens) - 1)


def together(llm: LLM, parts: ModelParts, prompts: list[list[int]], params: SamplingParams) -> float:
    """Output tokens per second with every prompt admitted at once."""
    parts.kv.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return sum(o.completion_tokens for o in outputs) / (time.perf_counter() - start)


def verify_rows(parts: ModelParts, most: int, repeats: int = 40) -> None:
    """A verify step's time by its query rows: one sequence at 300 tokens, every row sampled greedily."""
    backend = parts.backend
    assert isinstance(backend, NumpyBackend)
    times: dict[int, list[float]] = {rows: [] for rows in range(1, most + 1)}
    for _ in range(repeats):
        for rows in times:
            seq = SeqState(list(range(40)), list(range(1, 300)))
            batch = make_batch([seq], [list(range(5, 5 + rows))], parts.kv.block_size)
            batch = replace(batch, sample_rows=np.zeros(rows, np.int32), sampling=greedy(rows),
                            sample_lag=np.arange(rows - 1, -1, -1, dtype=np.int32))
            start = time.perf_counter()
            backend.execute(batch)
            times[rows].append(time.perf_counter() - start)
    base = statistics.median(times[1])
    print("verify step by query rows (one sequence, 300 tokens of context), p50 of", repeats)
    for rows, samples in times.items():
        p50 = statistics.median(samples)
        print(f"  {rows} rows ({rows - 1} guesses): {1e3 * p50:6.2f} ms  {p50 / base:4.2f}x one row")


def report(arms: list[Arm], args: argparse.Namespace) -> None:
    off, on = arms
    print(f"\n{args.rounds} rounds, max_tokens {args.max_tokens}, num_speculative_tokens "
          f"{args.num_speculative_tokens}, ngram_max {args.ngram_max}, cpu_precision {args.cpu_precision}")
    for kind in ("quote", "chat"):
        a, b = statistics.median(off.tpot_ms[kind]), statistics.median(on.tpot_ms[kind])
        print(f"{kind}, one stream: TPOT p50 {a:.2f} -> {b:.2f} ms ({b / a:.2f}x); output tok/s per round "
              f"{_rates(off.single_tps[kind])} -> {_rates(on.single_tps[kind])} "
              f"({statistics.median(on.single_tps[kind]) / statistics.median(off.single_tps[kind]):.2f}x median)")
    if off.multi_tps:
        ratio = statistics.median(on.multi_tps) / statistics.median(off.multi_tps)
        print(f"chat, {args.streams} streams: output tok/s per round {_rates(off.multi_tps)} -> "
              f"{_rates(on.multi_tps)} ({ratio:.2f}x median), {on.guessed_together} tokens guessed")
    if on.guessed:
        print(f"guesses: {on.kept} of {on.guessed} kept ({on.kept / on.guessed:.0%}), "
              f"{on.guessed / on.verified_steps:.2f} guessed per verified sequence-step")


def _rates(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
