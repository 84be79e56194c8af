"""Gemma 3 270M (Q4_K_M, tests/gemma3.py) against an independent implementation: transformers' Gemma3ForCausalLM
run in float32 on the same GGUF (gemma3/reference.json, written by gemma3/make_reference.py; its facts in
gemma3/ARCHITECTURE.md). The tokenizer's ids, the first generated positions' top logits, and greedy
continuations token for token, including a prompt longer than the 512-token sliding window whose continuation
the reference shows to depend on the window being applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel, ModelFiles
from backends.numpy_backend.backend import NumpyBackend
from kvpool import HybridKVCacheManager, PagedKVCacheManager, TableChange, new_hybrid_manager
from kvpool.window import NO_BLOCK
from scheduler.config import SchedulerConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from tests.scheduler.test_engine_numpy import PreemptionCounter
from tests.service.live import numpy_client

REFERENCE = json.loads((Path(__file__).parent / "gemma3" / "reference.json").read_text(encoding="utf-8"))
PROMPTS = {p["name"]: p for p in REFERENCE["prompts"]}
BLOCK = 16
# Logits here reach 36: the reference sums in PyTorch's order, we in ours, and its RoPE angles are float32 products
# (ours float64, rounded once), off by up to position x 6e-8 rad. Measured (AVX2 host, float32 weights): at most
# 3.4e-5 on the short prompts, 1.2e-4 at position 709; 4x that.
LOGIT_TOL = 5e-4
MARGIN_FLOOR = 2 * LOGIT_TOL  # a greedy step closer than this to a tie may flip between two float32 implementations


@pytest.fixture(scope="module")
def model(gemma3_stored: LoadedModel) -> LoadedModel:
    """The weights as the file stores them: the kernels give a row the float32 copy's result bit for bit
    (tests/backends/test_native_quant.py), so this is also the float32 weights' run."""
    return gemma3_stored


@pytest.fixture(scope="module")
def backend(model: LoadedModel) -> NumpyBackend:
    b = NumpyBackend(model)
    b.init_cache(128, BLOCK)
    return b


def positions_logits(backend: NumpyBackend, ids: list[int], generated: list[int], count: int) -> np.ndarray:
    """Logits of the positions that predict generated[0..count): the prompt's prefill, then one decode step for
    each generated token fed back."""
    seq = SeqState(blocks=list(range(-(-(len(ids) + count) // BLOCK))))
    rows = [backend.compute_logits(make_batch([seq], [ids], BLOCK))[0]]
    rows += [backend.compute_logits(make_batch([seq], [[token]], BLOCK))[0] for token in generated[: count - 1]]
    return np.stack(rows)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_the_tokenizer_gives_the_references_ids(model: LoadedModel, name: str) -> None:
    case = PROMPTS[name]
    assert model.files.tokenizer.encode_prompt(case["prompt"]) == case["token_ids"]


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_the_first_positions_top_logits(backend: NumpyBackend, name: str) -> None:
    case = PROMPTS[name]
    top = case["greedy"]["top10"]
    logits = positions_logits(backend, case["token_ids"], case["greedy"]["ids"], len(top))
    for row, expected in zip(logits, top, strict=True):
        np.testing.assert_allclose(row[expected["ids"]], expected["logits"], atol=LOGIT_TOL, rtol=0)


def greedy(model: LoadedModel, backend: NumpyBackend, ids: list[int], steps: int) -> list[int]:
    llm = LLM(SchedulerConfig(), PagedKVCacheManager(128, BLOCK), backend, model.files.tokenizer, max_model_len=2048)
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))[0]
    return list(out.choices[0].token_ids)


def decided(case: dict[str, Any]) -> int:
    """How many of the reference's greedy tokens no near-tie could flip."""
    margins = case["margins"]
    return next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(margins))


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_continuations_are_the_references(model: LoadedModel, backend: NumpyBackend, name: str) -> None:
    case = PROMPTS[name]
    expected, sure = case["greedy"]["ids"], decided(case["greedy"])
    assert sure >= min(len(expected), 8)  # the comparison is not vacuous
    assert greedy(model, backend, case["token_ids"], len(expected))[:sure] == expected[:sure]


def test_together_on_a_small_pool_with_prefixes_shared(model: LoadedModel, backend: NumpyBackend) -> None:
    """Every short prompt twice, all in flight at once, on a pool too small for them: rows beside other rows
    (batch invariance), sequences preempted and recomputed, and each prompt's second copy served from its first's
    cached blocks; every continuation is still the reference's."""
    cases = [PROMPTS[name] for name in sorted(PROMPTS) if name != "window"]
    kv, observer = PagedKVCacheManager(12, BLOCK), PreemptionCounter()  # 12 sequences of 1-2 blocks in 12 blocks
    llm = LLM(SchedulerConfig(), kv, backend, model.files.tokenizer, max_model_len=256, observer=observer)
    steps = 16
    outs = llm.generate([c["token_ids"] for c in cases] * 2,
                        SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    assert observer.preempted and kv.stats().prefix_hits > 0 and kv.stats().used_blocks == 0
    for out, case in zip(outs, cases * 2, strict=True):
        sure = min(steps, decided(case["greedy"]))
        assert list(out.choices[0].token_ids)[:sure] == case["greedy"]["ids"][:sure]


def test_with_the_sliding_layers_in_a_pool_of_their_own(model: LoadedModel) -> None:
    """The long prompt twice and the short ones, all in flight at once, with the sliding layers' KV in a pool of
    their own smaller than the two long prompts' tables: those give back the blocks that fall behind the window
    as they run (which the long prompt's continuation depends on: the test below), sequences are preempted and
    recomputed on both pools, prefixes served from both; every continuation is still the reference's."""
    backend = NumpyBackend(model)
    window = model.files.config.sliding_window
    kv = new_hybrid_manager(56, 70, BLOCK, window, step_tokens=SchedulerConfig().max_num_batched_tokens)
    backend.init_cache(kv.num_blocks, BLOCK, kv.window_blocks)
    given_back = _count_given_back(kv)
    cases = [PROMPTS["window"]] * 2 + [PROMPTS[name] for name in sorted(PROMPTS) if name != "window"]
    assert 2 * -(-len(PROMPTS["window"]["token_ids"]) // BLOCK) > kv.window_blocks
    observer, steps = PreemptionCounter(), 24
    llm = LLM(SchedulerConfig(), kv, backend, model.files.tokenizer, max_model_len=1024, observer=observer)
    outs = llm.generate([c["token_ids"] for c in cases], SamplingParams(temperature=0.0, max_tokens=steps,
                                                                        ignore_eos=True))
    assert observer.preempted and given_back and kv.stats().prefix_hits > 0
    assert kv.stats().used_blocks == 0 and kv.stats().window_used_blocks == 0
    for out, case in zip(outs, cases, strict=True):
        sure = min(steps, decided(case["greedy"]))
        assert list(out.choices[0].token_ids)[:sure] == case["greedy"]["ids"][:sure], case["name"]


def _count_given_back(kv: HybridKVCacheManager) -> list[TableChange]:
    """The window table entries the pool's appends give back, as they happen."""
    seen: list[TableChange] = []
    append = kv.append

    def counting(*args: Any, **kwargs: Any) -> tuple[int, list[TableChange]]:
        done, changes = append(*args, **kwargs)
        seen.extend(c for c in changes if c[3] == 1 and c[2] == NO_BLOCK)
        return done, changes

    kv.append = counting  # type: ignore[method-assign]
    return seen


def test_the_long_prompt_needs_the_window() -> None:
    """The reference's continuation of the long prompt without the window differs from its windowed one (which
    the test above matches): that test would fail with every layer attending to the whole prompt."""
    case = PROMPTS["window"]
    assert len(case["token_ids"]) > REFERENCE["gguf_metadata"]["gemma3.attention.sliding_window"]
    with_window, without = case["greedy"]["ids"], case["without_window"]["ids"]
    first = next(i for i, (a, b) in enumerate(zip(with_window, without, strict=False)) if a != b)
    assert first < decided(case["greedy"])


def test_served_over_http_with_a_chat_template_given(gemma3_chat_files: ModelFiles) -> None:
    """`--chat-template` gives the base file Gemma's turns; its <end_of_turn> then stops generation (the file
    names no end-of-turn id), and a completion is the reference's text."""
    files = gemma3_chat_files
    assert files.tokenizer.eos_token_ids == (1, 106)
    case = PROMPTS["fact"]
    with numpy_client(files, max_model_len=1024, num_blocks=128) as client:
        name = client.models.list().data[0].id
        out = client.completions.create(model=name, prompt=case["prompt"], max_tokens=8, temperature=0)
        assert out.choices[0].text == files.tokenizer.decode(case["greedy"]["ids"][:8])
        chat = client.chat.completions.create(model=name, max_tokens=24, temperature=0,
                                              messages=[{"role": "user", "content": "Say hello."}])
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage is not None
