"""Speculative decoding with a draft model (scheduler/draft.py) on the real model: a random-weight draft with
SmolLM2's tokenizer changes no token, greedy or seeded, with preemption and prefix caching on and the KV
pools (the draft's too) checked after every step; SmolLM2 drafting for itself has nearly every guess kept
(the draft proposes the right tokens at the right positions); a draft that fails costs its guesses only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from backends.base import StepBatch, StepOutput
from backends.model.loader import LoadedModel, default_model_path, load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.weights import STORED_TYPES
from backends.step_shape import CostCoefficients
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.draft import DraftJob, DraftModel
from scheduler.engine import Engine
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_cost import StepCostModel
from telemetry.interface import NullObserver
from tests.backends.tiny_gguf import TinyShape, Vocab, write_tiny_llama

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4, 5, 6, 7, 8,",
           "The quick brown fox", "Dear Sir or Madam,"]
DRAFT = SpeculativeConfig("draft", 3, draft_model="draft.gguf")  # the path is the test's to open


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """Random weights of Llama's architecture over SmolLM2's 49,152 tokens."""
    path = tmp_path_factory.mktemp("draft") / "draft.gguf"
    write_tiny_llama(path, shape=TinyShape(context=8192), vocab=Vocab.of_file(default_model_path()))
    return load_model(path, stored=STORED_TYPES)


def draft_of(model: LoadedModel, num_blocks: int) -> DraftModel:
    backend = NumpyBackend(model)
    backend.init_cache(num_blocks, 16)
    return DraftModel(backend, PagedKVCacheManager(num_blocks, 16, enable_prefix_caching=False))


class Preemptions(NullObserver):
    def __init__(self) -> None:
        self.count = 0

    def request_preempted(self, request_id: str, now: float) -> None:
        self.count += 1


def make_llm(model: LoadedModel, num_blocks: int, draft: DraftModel | None = None,
             observer: NullObserver | None = None) -> LLM:
    backend = NumpyBackend(model)
    backend.init_cache(num_blocks, 16)
    llm = LLM(SchedulerConfig(debug_checks=True), PagedKVCacheManager(num_blocks, 16), backend,
              model.files.tokenizer, max_model_len=2048, observer=observer, speculative=DRAFT if draft else None,
              draft=draft)
    llm.core.scheduler.cost = StepCostModel(CostCoefficients())  # guesses cost nothing: every sequence guesses
    return llm


def token_ids(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [list(o.choices[0].token_ids) for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def prompts(real_model_stored: LoadedModel) -> list[list[int]]:
    tokenizer = real_model_stored.files.tokenizer
    return [tokenizer.encode(p) for p in PROMPTS] + [tokenizer.encode("Water boils at")] * 2  # a shared prefix


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_tokens=24),
                                    SamplingParams(temperature=0.8, seed=7, max_tokens=24)], ids=["greedy", "seeded"])
def test_a_random_draft_changes_no_token(real_model_stored: LoadedModel, tiny_draft: LoadedModel,
                                         prompts: list[list[int]], params: SamplingParams) -> None:
    """12 blocks of 16 tokens for 8 sequences of ~30: the served pool preempts, and the draft's pool of as many
    blocks runs short too (a sequence it cannot hold guesses nothing)."""
    plain = token_ids(make_llm(real_model_stored, 12), prompts, params)
    draft, preemptions = draft_of(tiny_draft, 12), Preemptions()
    short: list[int] = []  # jobs the draft's pool could not give all their guesses
    propose = draft.propose

    def counting(jobs: Sequence[DraftJob]) -> dict[int, list[int]]:
        guesses = propose(jobs)
        short.extend(job.seq_id for job in jobs if len(guesses.get(job.seq_id, [])) < job.k)
        return guesses

    draft.propose = counting  # type: ignore[method-assign]
    llm = make_llm(real_model_stored, 12, draft, preemptions)
    assert token_ids(llm, prompts, params) == plain
    assert preemptions.count > 0 and short
    speculator = llm.core.scheduler.speculator
    assert speculator is not None and speculator.counters.proposed > 50
    draft.propose([])  # the ended sequences' blocks go back at the next proposal
    assert draft.kv.stats().used_blocks == 0


def test_the_model_drafting_for_itself_has_nearly_every_guess_kept(real_model_stored: LoadedModel,
                                                                   prompts: list[list[int]]) -> None:
    """Greedy, the draft's tokens are the model's own: a guess is rejected only where a chunk's row and a decode
    row round differently enough to flip an argmax."""
    params = SamplingParams(temperature=0.0, max_tokens=24)
    llm = make_llm(real_model_stored, 160, draft_of(real_model_stored, 160))
    assert token_ids(llm, prompts, params) == token_ids(make_llm(real_model_stored, 160), prompts, params)
    speculator = llm.core.scheduler.speculator
    assert speculator is not None
    counters = speculator.counters
    assert counters.proposed > 100 and counters.accepted >= 0.9 * counters.proposed, counters


def test_a_draft_rewinds_to_what_the_sequence_kept(tiny_draft: LoadedModel) -> None:
    """The draft's pool keeps the tokens still the sequence's and gives back its guesses the model did not keep;
    a sequence's last token is always fed again (its logits give the first guess)."""
    draft = draft_of(tiny_draft, 8)
    first = draft.propose([DraftJob(1, [5, 6, 7], 3)])[1]
    assert len(first) == 3 and draft.kv.stats().used_blocks == 1
    kept = [5, 6, 7, first[0], 999]  # the first guess kept, then the model's own token
    again = draft.propose([DraftJob(1, kept, 2)])[1]
    assert len(again) == 2
    assert draft._fed[1].tokens == [*kept, again[0]]  # fed: the tokens kept, then its new first guess
    alone = draft_of(tiny_draft, 8).propose([DraftJob(2, kept, 2)])[2]
    assert again == alone  # what it kept of the first round is the KV a fresh start computes
    draft.forget(1)
    draft.propose([])
    assert draft.kv.stats().used_blocks == 0


class FailingDraft(NumpyBackend):
    def execute(self, batch: StepBatch) -> StepOutput:
        raise RuntimeError("the draft's device fell over")


def test_a_failing_draft_costs_its_guesses_and_nothing_else(real_model_stored: LoadedModel,
                                                            tiny_draft: LoadedModel,
                                                            prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    plain = token_ids(make_llm(real_model_stored, 160), prompts, params)
    failing = FailingDraft(tiny_draft)
    failing.init_cache(160, 16)

    async def served() -> tuple[list[list[int]], Engine]:
        backend = NumpyBackend(real_model_stored)
        backend.init_cache(160, 16)
        draft = DraftModel(failing, PagedKVCacheManager(160, 16, enable_prefix_caching=False))
        engine = Engine(SchedulerConfig(debug_checks=True), PagedKVCacheManager(160, 16), backend,
                        real_model_stored.files.tokenizer, max_model_len=2048, speculative=DRAFT, draft=draft)
        engine.core.scheduler.cost = StepCostModel(CostCoefficients())
        await engine.start()
        streams = [engine.submit(EngineRequest(f"r{i}", tuple(p), params)) for i, p in enumerate(prompts)]
        outputs = [await stream.collect() for stream in streams]
        await engine.stop()
        return [list(o.choices[0].token_ids) for o in outputs], engine

    outputs, engine = asyncio.run(served())
    assert outputs == plain
    assert engine.draft_failure is not None and "fell over" in engine.draft_failure
    assert engine.failure is None and engine.core.scheduler.speculator is not None
    assert engine.core.scheduler.speculator.counters.proposed == 0


def test_guesses_cost_what_the_pool_holds(tiny_draft: LoadedModel) -> None:
    """A pool of one block holds one 3-token sequence and its guesses up to 16 tokens; a second sequence gets
    none, and nothing is preempted."""
    draft = draft_of(tiny_draft, 1)
    got = draft.propose([DraftJob(1, list(range(10, 13)), 3), DraftJob(2, list(range(20, 34)), 3)])
    assert len(got[1]) == 3 and got[2] == [] and draft.kv.stats().used_blocks == 1
