"""Speculative decoding served over HTTP: the official client gets, streamed or not, the tokens the same model
answers without it, and /metrics counts the guesses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from backends.config import BackendConfig
from backends.model.loader import LoadedModel, default_model_path
from backends.numpy_backend.backend import NumpyBackend
from bench.loadgen.measure import measure
from bench.loadgen.spec import Bounds, LoadShape, RequestSpec, Target
from bench.loadgen.speculation import format_speculation
from bench.loadgen.workloads import FileWorkload
from kvpool import PagedKVCacheManager
from kvpool.config import KVPoolConfig
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from service.config.settings import AppConfig, ServiceConfig
from tests.backends.tiny_gguf import TinyShape, Vocab, write_tiny_llama
from tests.service.live import LiveServer, cached_builder

MODEL = "SmolLM2-135M-Instruct"
ASK = ("Copy the following sentence exactly, correcting only its spelling: The comittee met on Tuesday to reveiw "
       "the budget for the new libary, and agreed that the libary would open in the spring.")
MAX_TOKENS = 40
SERIES = 'pagedserve:spec_decode_{}_total{{method="ngram"}}'


@pytest.fixture(scope="module")
def server(real_model_stored: LoadedModel) -> Iterator[LiveServer]:
    config = AppConfig(service=ServiceConfig(port=0), backend=BackendConfig(name="numpy"),
                       scheduler=SchedulerConfig(max_model_len=1024), kv=KVPoolConfig(num_blocks=128),
                       speculative=SpeculativeConfig("ngram"))
    live = LiveServer.start(config, cached_builder(real_model_stored.files), timeout=120)
    yield live
    live.close()


@pytest.fixture(scope="module")
def prompt(real_model_stored: LoadedModel) -> list[int]:
    files = real_model_stored.files
    return files.tokenizer.encode(files.chat_template.render([{"role": "user", "content": ASK}]))


@pytest.fixture(scope="module")
def unguessed(real_model_stored: LoadedModel, prompt: list[int]) -> tuple[str, int, str | None]:
    """The answer without speculation, from the engine in this process on the same weights: its text, tokens
    and finish reason."""
    backend = NumpyBackend(real_model_stored)
    backend.init_cache(128, 16)
    llm = LLM(SchedulerConfig(), PagedKVCacheManager(128, 16), backend, real_model_stored.files.tokenizer,
              max_model_len=1024)
    [output] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return output.choices[0].text, output.completion_tokens, output.choices[0].finish_reason


def test_answers_are_those_without_speculation(server: LiveServer, prompt: list[int],
                                               unguessed: tuple[str, int, str | None]) -> None:
    text, tokens, finish = unguessed
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    before = server.metrics()
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         stream=True)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (text, finish)
    assert "".join(chunk.choices[0].text for chunk in streamed) == text
    after = server.metrics()
    guessed = after[SERIES.format("draft_tokens")] - before.get(SERIES.format("draft_tokens"), 0.0)
    kept = after[SERIES.format("accepted_tokens")] - before.get(SERIES.format("accepted_tokens"), 0.0)
    assert 0 < kept <= guessed  # the answer repeats its prompt: guesses were made, and some kept
    assert whole.usage is not None and whole.usage.completion_tokens == tokens


def test_the_bench_reports_the_runs_acceptance_rate(server: LiveServer) -> None:
    """`pagedserve bench` reads the server's spec_decode counters over its measured run (warm-up excluded) and
    prints the share of guessed tokens kept."""
    spec = RequestSpec(messages=(("user", ASK),), max_tokens=MAX_TOKENS, ignore_eos=False, temperature=0.0)
    before = server.metrics()
    m = asyncio.run(measure(Target(server.url, "chat"), FileWorkload((spec,)), LoadShape(concurrency=1),
                            Bounds(2, warmup=1)))
    after = server.metrics()
    guessed = after[SERIES.format("draft_tokens")] - before[SERIES.format("draft_tokens")]
    assert m.summary.completed == 2 and m.speculation is not None
    assert 0 < m.speculation.kept <= m.speculation.guessed < guessed  # the run's two requests, not the warm-up
    assert "guessed tokens kept (acceptance" in format_speculation(m.speculation)



def test_a_draft_model_serves_the_same_answers(real_model_stored: LoadedModel, prompt: list[int],
                                                unguessed: tuple[str, int, str | None], tmp_path: Path) -> None:
    """`--speculative-method draft` over HTTP: a random-weight draft with SmolLM2's tokens guesses (mostly
    wrongly), /metrics counts its guesses under method="draft", and the official client gets the same text."""
    draft = write_tiny_llama(tmp_path / "draft.gguf", shape=TinyShape(context=8192),
                             vocab=Vocab.of_file(default_model_path()))
    config = AppConfig(service=ServiceConfig(port=0), backend=BackendConfig(name="numpy"),
                       scheduler=SchedulerConfig(max_model_len=1024), kv=KVPoolConfig(num_blocks=128),
                       speculative=SpeculativeConfig("draft", draft_model=str(draft)))
    live = LiveServer.start(config, cached_builder(real_model_stored.files), timeout=120)
    try:
        client = OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                             stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed) == unguessed[0]
        series = 'pagedserve:spec_decode_{}_total{{method="draft"}}'
        metrics = live.metrics()
        assert metrics[series.format("draft_tokens")] > 0
        assert 0 <= metrics[series.format("accepted_tokens")] <= metrics[series.format("draft_tokens")]
    finally:
        live.close()
