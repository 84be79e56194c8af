"""The engine on the real model: batching must not change anyone's tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends.model.loader import LoadedModel
from backends.numpy_backend.backend import NumpyBackend
from backends.step_shape import CostCoefficients
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.engine import Engine
from scheduler.llm import LLM
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_cost import StepCostModel
from telemetry.interface import NullObserver

PROMPTS = [
    "The capital of France is", "def fibonacci(n):", "Once upon a time", "In 1969, 3 astronauts",
    "The best way to learn", "Water boils at", "My favourite colour is", "import numpy as np\n",
    "The quick brown fox", "Dear Sir or Madam,", "Rain is", "1, 2, 3, 4,", "The sun rises in the",
    "Python is a", "Cats and dogs", "Hello! How are",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def model(real_model: LoadedModel) -> LoadedModel:
    return real_model  # loaded once for the session (tests/conftest.py)


@pytest.fixture()
def backend(model: LoadedModel) -> Iterator[NumpyBackend]:
    backend = NumpyBackend(model)
    backend.init_cache(160, 16)
    yield backend


def make_llm(model: LoadedModel, backend: NumpyBackend, num_blocks: int = 160,
             observer: NullObserver | None = None, speculative: SpeculativeConfig | None = None) -> LLM:
    kv = PagedKVCacheManager(num_blocks, 16)
    return LLM(SchedulerConfig(debug_checks=speculative is not None), kv, backend, model.files.tokenizer,
               max_model_len=2048, observer=observer, speculative=speculative)


def encode(model: LoadedModel, text: str) -> list[int]:
    return model.files.tokenizer.encode(text)


def test_sixteen_concurrent_requests_give_what_each_gives_alone(model: LoadedModel, backend: NumpyBackend) -> None:
    prompts = [encode(model, p) for p in PROMPTS]
    alone = [make_llm(model, backend).generate([p], GREEDY)[0].choices[0].token_ids for p in prompts]

    async def concurrent() -> list[RequestOutput]:
        kv = PagedKVCacheManager(160, 16)
        engine = Engine(SchedulerConfig(max_num_batched_tokens=64), kv, backend, model.files.tokenizer,
                        max_model_len=2048)
        await engine.start()
        streams = [engine.submit(EngineRequest(f"r{i}", tuple(p), GREEDY)) for i, p in enumerate(prompts)]
        outs = await asyncio.gather(*(s.collect() for s in streams))
        await engine.stop()
        assert kv.stats().used_blocks == 0
        return list(outs)

    together = asyncio.run(concurrent())
    assert [o.choices[0].token_ids for o in together] == alone
    assert sum(len(t) for t in alone) >= 16 * 3  # real generations, not early stops


def test_preempted_request_gives_the_same_tokens(model: LoadedModel, backend: NumpyBackend) -> None:
    prompts = [encode(model, p) for p in PROMPTS[:4]]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    roomy = make_llm(model, backend).generate(prompts, params)
    observer = PreemptionCounter()
    tight = make_llm(model, backend, num_blocks=5, observer=observer)  # 4 sequences of 2 blocks in 5 blocks
    cramped = tight.generate(prompts, params)
    assert observer.preempted  # the scenario really preempted someone
    assert [o.choices[0].token_ids for o in cramped] == [o.choices[0].token_ids for o in roomy]


def test_guessing_changes_no_token_under_preemption_and_prefix_hits(model: LoadedModel, backend: NumpyBackend
                                                                     ) -> None:
    """Sixteen greedy requests, four of them sharing a prompt (prefix-cache hits), in a pool too small for all:
    with prompt lookup's guesses verified in the steps, every token and logprob is what it is without them
    (exact precision: each row's logits are its own, whatever else the step computes)."""
    prompts = [encode(model, p) for p in PROMPTS[:12]] + [encode(model, "1, 2, 3, 4, 5, 6, 7, 8,")] * 4
    params = SamplingParams(temperature=0.0, max_tokens=20, logprobs=True, top_logprobs=3)
    unguessed = PreemptionCounter()
    plain = make_llm(model, backend, num_blocks=24, observer=unguessed).generate(prompts, params)
    observer = PreemptionCounter()
    llm = make_llm(model, backend, num_blocks=24, observer=observer, speculative=SpeculativeConfig("ngram"))
    llm.core.scheduler.cost = StepCostModel(CostCoefficients())  # guesses cost nothing: all are made, even at 16
    guessed = llm.generate(prompts, params)
    assert [o.choices[0].token_ids for o in guessed] == [o.choices[0].token_ids for o in plain]
    # Bit for bit: a guessed position's row attends as a decode row does (a chunk's rows attend together).
    # A recomputed request's next token comes from its chunk's last row instead: preempted ones are left out.
    preempted = set(observer.preempted) | set(unguessed.preempted)
    kept = [i for i, o in enumerate(plain) if o.request_id not in preempted]
    assert len(kept) >= 8
    assert [guessed[i].choices[0].logprobs for i in kept] == [plain[i].choices[0].logprobs for i in kept]
    speculator = llm.core.scheduler.speculator
    assert speculator is not None and speculator.counters.accepted > 0
    assert observer.preempted


class PreemptionCounter(NullObserver):
    def __init__(self) -> None:
        self.preempted: list[str] = []

    def request_preempted(self, request_id: str, now: float) -> None:
        self.preempted.append(request_id)


def test_stop_string_across_token_boundary_on_the_real_model(model: LoadedModel, backend: NumpyBackend) -> None:
    tok = model.files.tokenizer
    prompt = encode(model, "The capital of France is")
    full = make_llm(model, backend).generate([prompt], SamplingParams(temperature=0.0, max_tokens=10))[0]
    pieces = [tok.decode([t]) for t in full.choices[0].token_ids]
    k = next(i for i in range(len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]  # spans two tokens
    out = make_llm(model, backend).generate([prompt], SamplingParams(temperature=0.0, max_tokens=10,
                                                                     stop=(stop,)))[0].choices[0]
    text = full.choices[0].text
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
