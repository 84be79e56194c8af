"""Workloads: seeded, the right lengths, the right shapes of request."""

from __future__ import annotations

import json
import math
import random
import statistics
from itertools import islice
from pathlib import Path

import pytest

from backends.model.loader import open_model
from bench.loadgen.client import request_body
from bench.loadgen.spec import Conversation, RequestSpec, Single, Target
from bench.loadgen.workloads import (
    WORDS,
    ChatWorkload,
    FileWorkload,
    Lengths,
    RandomWorkload,
    SharedPrefixWorkload,
    random_text,
)


def firsts(workload: object, n: int) -> list[RequestSpec]:
    return [s.first() for s in islice(workload.sessions(), n)]  # type: ignore[attr-defined]


def test_random_workload_is_seeded_and_sized() -> None:
    w = RandomWorkload(Lengths(40), Lengths(7), seed=4)
    specs = firsts(w, 20)
    assert specs == firsts(RandomWorkload(Lengths(40), Lengths(7), seed=4), 20)
    assert specs != firsts(RandomWorkload(Lengths(40), Lengths(7), seed=5), 20)
    assert all(len(s.prompt.split()) == 40 and s.max_tokens == 7 and s.ignore_eos for s in specs)


def test_words_are_one_token_each() -> None:
    tokenizer = open_model()[1].tokenizer
    assert all(len(tokenizer.encode(" " + w)) == 1 for w in WORDS)
    text = random_text(random.Random(0), 300)
    # exactly: every " word" one token (above), and the first word, without its space, one too with this seed (2 of
    # the 147 words are two tokens bare)
    assert len(tokenizer.encode(text)) == 300


def test_lognormal_lengths_have_the_median_and_a_long_tail() -> None:
    rng = random.Random(1)
    lengths = Lengths(100, "lognormal", 1.0)
    sample = [lengths.sample(rng) for _ in range(5000)]
    assert statistics.median(sample) == pytest.approx(100, rel=0.06)  # 3.4 standard errors (1.8 %); measured 2.0 %
    # lognormal mean, less the cap's 4.9 % (the tail past 8x the median), give or take 1.9 % (one standard error);
    # measured 7.9 % under with this seed
    assert statistics.fmean(sample) == pytest.approx(100 * math.exp(0.5), rel=0.08)
    assert max(sample) == 800 and min(sample) >= 1  # capped at 8x the median
    with pytest.raises(ValueError):
        Lengths(0)


def test_shared_prefix_uses_few_prefixes() -> None:
    specs = firsts(SharedPrefixWorkload(3, 50, Lengths(5), Lengths(4), seed=0), 60)
    systems = {s.messages[0][1] for s in specs}
    assert len(systems) == 3 and all(len(p.split()) == 50 for p in systems)
    assert all(s.prompt.startswith(s.messages[0][1]) and s.messages[1][0] == "user" for s in specs)
    messages = request_body(Target(endpoint="chat"), specs[0])["messages"]
    assert isinstance(messages, list) and messages[0]["role"] == "system"
    assert request_body(Target(), specs[0])["prompt"] == specs[0].prompt


def test_conversation_turns() -> None:
    conv = next(ChatWorkload(2, Lengths(3), Lengths(2), seed=0).sessions())
    assert isinstance(conv, Conversation)
    first = conv.first()
    second = conv.follow(first, "answer one")
    assert second is not None and second.messages[-2] == ("assistant", "answer one")
    assert conv.follow(second, "answer two") is None
    assert "assistant: answer one" in second.completion_prompt()  # the completions form of a chat


def test_file_workload(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "one", "max_tokens": 3}, {"messages": [{"role": "user", "content": "two"}]}, {}]
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n")
    w = FileWorkload.load(path, default_max_tokens=9)
    specs = firsts(w, 6)
    assert {s.prompt or s.messages[0][1] for s in specs} == {"one", "two"}
    assert {s.max_tokens for s in specs} == {3, 9}
    assert isinstance(next(w.sessions()), Single)
    path.write_text(json.dumps(lines[2]))
    with pytest.raises(ValueError, match="prompts.jsonl:1"):
        FileWorkload.load(path)


def test_a_request_sends_its_temperature_only_when_given() -> None:
    """The server's default temperature is OpenAI's 1.0: a bench that needs greedy answers must say so."""
    assert "temperature" not in request_body(Target(), RequestSpec(prompt="x"))
    assert request_body(Target(), RequestSpec(prompt="x", temperature=0.0))["temperature"] == 0.0
