"""Random sampling served over HTTP on the real model (the NumPy backend's C sampler): a seeded answer is the same
however often it is asked, streamed or not, and whatever else shares its steps; top-k 1, a tiny top-p and min-p
1 each leave only the most likely token, so at a high temperature they give the greedy answer."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from openai import OpenAI

from backends.config import BackendConfig
from backends.model.loader import LoadedModel
from kvpool.config import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config.settings import AppConfig, ServiceConfig
from tests.service.live import LiveServer, cached_builder

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Write one sentence about the sea."
OTHERS = ("List three colours.", "What is 12 times 12?", "Name a river in Europe.")
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def client(real_model_stored: LoadedModel) -> Iterator[OpenAI]:
    config = AppConfig(service=ServiceConfig(port=0), backend=BackendConfig(name="numpy"),
                       scheduler=SchedulerConfig(max_model_len=1024), kv=KVPoolConfig(num_blocks=128))
    live = LiveServer.start(config, cached_builder(real_model_stored.files), timeout=120)
    yield OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    live.close()


def answer(client: OpenAI, prompt: str, **sampling: Any) -> str:
    extra = {key: sampling.pop(key) for key in ("top_k", "min_p") if key in sampling}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                         max_tokens=MAX_TOKENS, extra_body=extra, **sampling)
    return out.choices[0].message.content or ""


def test_a_seeded_answer_does_not_change(client: OpenAI) -> None:
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 11}
    first = answer(client, PROMPT, **sampling)
    streamed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=MAX_TOKENS, stream=True, **sampling)  # type: ignore[call-overload]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == first
    assert len(first.split()) > 5
    with ThreadPoolExecutor(len(OTHERS) + 1) as pool:  # the same request among others, in the same steps
        others = [pool.submit(answer, client, other, temperature=1.0, seed=5) for other in OTHERS]
        assert pool.submit(answer, client, PROMPT, **sampling).result() == first
        assert all(o.result() for o in others)
    assert answer(client, PROMPT, temperature=0.9, top_p=0.95, seed=12) != first  # the seed does count


@pytest.mark.parametrize("only_the_top", [{"top_k": 1}, {"top_p": 0.001}, {"min_p": 1.0}],
                         ids=["top_k=1", "top_p=0.001", "min_p=1"])
def test_filters_that_keep_one_token_give_the_greedy_answer(client: OpenAI, only_the_top: dict[str, Any]) -> None:
    greedy = answer(client, PROMPT, temperature=0)
    assert answer(client, PROMPT, temperature=1.5, seed=3) != greedy  # unfiltered, this temperature wanders
    assert answer(client, PROMPT, temperature=1.5, seed=3, **only_the_top) == greedy
