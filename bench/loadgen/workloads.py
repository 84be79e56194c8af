"""Workloads: endless, seeded streams of sessions (one request each, or a multi-turn chat).

Prompts are built from common English words that byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM) encode as
one token each with their leading space, so an n-word prompt is about n tokens without a tokenizer here; the
exact counts come back in each response's usage.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.loadgen.spec import Conversation, Message, RequestSpec, Session, Single

WORDS = tuple(
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their has been if more when will would who so no time people year way day "
    "man thing woman life child world school state family student group country problem hand part place case week "
    "company system program question work government number night point home water room mother area money story "
    "fact month lot right study book eye job word business issue side kind head house service friend father power "
    "hour game line end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education".split())
DISTRIBUTIONS = ("fixed", "lognormal")


class Workload(Protocol):
    def sessions(self) -> Iterator[Session]:
        """Sessions without end (a file's prompts cycle); the runner's bounds decide how many are used."""
        ...


@dataclass(frozen=True)
class Lengths:
    """A token count: fixed at `median`, or log-normal around it (sigma 1: most short, a long tail)."""

    median: int
    dist: str = "fixed"
    sigma: float = 1.0
    cap: int | None = None  # long-tail cap; None: 8x the median

    def __post_init__(self) -> None:
        if self.median < 1 or self.dist not in DISTRIBUTIONS or self.sigma < 0:
            raise ValueError(f"lengths need a median >= 1, a distribution in {DISTRIBUTIONS}, sigma >= 0")

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            return self.median
        cap = self.cap if self.cap is not None else 8 * self.median
        return min(cap, max(1, round(rng.lognormvariate(math.log(self.median), self.sigma))))


def random_text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


@dataclass(frozen=True)
class RandomWorkload:
    """Random prompts of `input_len` tokens asking for `output_len` tokens (ignore_eos: exactly that many)."""

    input_len: Lengths
    output_len: Lengths
    ignore_eos: bool = True
    seed: int = 0

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        while True:
            prompt = random_text(rng, self.input_len.sample(rng))
            yield Single(RequestSpec(prompt=prompt, max_tokens=self.output_len.sample(rng),
                                     ignore_eos=self.ignore_eos))


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """Many requests over a few long system prompts: each request is one of `num_prefixes` prefixes of
    `prefix_len` tokens (chosen at random) followed by its own question; what prefix caching is for."""

    num_prefixes: int
    prefix_len: int
    question_len: Lengths
    output_len: Lengths
    ignore_eos: bool = True
    seed: int = 0

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        prefixes = [random_text(rng, self.prefix_len) for _ in range(self.num_prefixes)]
        while True:
            prefix, question = rng.choice(prefixes), random_text(rng, self.question_len.sample(rng))
            messages: tuple[Message, ...] = (("system", prefix), ("user", question))
            yield Single(RequestSpec(prompt=f"{prefix}\n\n{question}", messages=messages,
                                     max_tokens=self.output_len.sample(rng), ignore_eos=self.ignore_eos))


@dataclass(frozen=True)
class ChatWorkload:
    """Multi-turn conversations: `turns` user messages, each sent with the whole history so far."""

    turns: int
    user_len: Lengths
    output_len: Lengths
    system_len: int = 0
    ignore_eos: bool = True
    seed: int = 0

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        while True:
            system = random_text(rng, self.system_len) if self.system_len else ""
            turns = tuple(random_text(rng, self.user_len.sample(rng)) for _ in range(self.turns))
            yield Conversation(turns, system, self.output_len.sample(rng), self.ignore_eos)


@dataclass(frozen=True)
class FileWorkload:
    """Prompts from a JSONL file, one object a line: {"prompt": str} or {"messages": [{"role", "content"}]},
    with an optional "max_tokens" (else `default_max_tokens`). They cycle, in a seeded shuffled order."""

    specs: tuple[RequestSpec, ...]
    seed: int = 0

    @classmethod
    def load(cls, path: str | Path, default_max_tokens: int = 128, ignore_eos: bool = True,
             seed: int = 0) -> FileWorkload:
        specs = []
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                specs.append(_spec_of(json.loads(line), default_max_tokens, ignore_eos, f"{path}:{number}"))
        if not specs:
            raise ValueError(f"{path}: no prompts")
        return cls(tuple(specs), seed)

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        order = list(range(len(self.specs)))
        while True:
            rng.shuffle(order)
            yield from (Single(self.specs[i]) for i in order)


def _spec_of(item: Any, default_max_tokens: int, ignore_eos: bool, where: str) -> RequestSpec:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object")
    max_tokens = int(item.get("max_tokens", default_max_tokens))
    if isinstance(item.get("prompt"), str):
        return RequestSpec(prompt=item["prompt"], max_tokens=max_tokens, ignore_eos=ignore_eos)
    messages = item.get("messages")
    if isinstance(messages, list) and messages:
        pairs = tuple((str(m["role"]), str(m["content"])) for m in messages)
        return RequestSpec(messages=pairs, max_tokens=max_tokens, ignore_eos=ignore_eos)
    raise ValueError(f"{where}: needs a 'prompt' string or a non-empty 'messages' list")
