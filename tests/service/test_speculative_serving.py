"""Speculative decoding served over HTTP: the official client gets, streamed or not, the tokens the same model
answers without it, and /metrics counts the guesses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from backends.config import BackendConfig
from backends.model.loader import LoadedModel
from backends.numpy_backend.backend import NumpyBackend
from kvpool import PagedKVCacheManager
from kvpool.config import KVPoolConfig
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from service.config.settings import AppConfig, ServiceConfig
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
