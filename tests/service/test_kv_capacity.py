"""Over HTTP, on KV pools far smaller than the model's context: a request the pool can never hold is refused
at once (it used to be preempted and recomputed forever, holding up everyone queued behind it), a request
without max_tokens stops at the pool's size, and one preempted past the bound fails with a retryable 503."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, sse_events

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"


def tokens(count: int, first: int = 1000) -> list[int]:
    return [first + i for i in range(count)]


def serve(model_files: ModelFiles, num_blocks: int, block_size: int, **scheduler: Any) -> LiveServer:
    config = replace(sim_config(**scheduler), kv=KVPoolConfig(num_blocks=num_blocks, block_size=block_size))
    return LiveServer.start(config, cached_builder(model_files))


@pytest.fixture(scope="module")
def pool64(model_files: ModelFiles) -> Iterator[LiveServer]:
    """4 blocks of 16: 64 tokens of KV cache, with the default preemption bound."""
    server = serve(model_files, num_blocks=4, block_size=16)
    yield server
    server.close()


@pytest.fixture(scope="module")
def pool16_no_preemption(model_files: ModelFiles) -> Iterator[LiveServer]:
    """4 blocks of 4 (16 tokens), and a request fails on its first preemption."""
    server = serve(model_files, num_blocks=4, block_size=4, max_preemptions=0)
    yield server
    server.close()


def test_a_request_the_pool_can_never_hold_gets_400_and_the_one_behind_it_is_served(pool64: LiveServer) -> None:
    big = post(pool64.url + CMPL, {"prompt": tokens(40), "max_tokens": 100, "ignore_eos": True})
    assert big.status == 400, big.body
    error = big.error()
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
    assert "64 tokens" in error["message"] and "140" in error["message"]
    small = post(pool64.url + CMPL, {"prompt": tokens(2), "max_tokens": 2, "ignore_eos": True})
    assert small.status == 200, small.body
    assert small.json()["usage"]["completion_tokens"] == 2
    stats = pool64.stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv.used_blocks == 0


def test_a_chat_without_max_tokens_ends_by_length_at_the_pools_size(pool64: LiveServer) -> None:
    reply = post(pool64.url + CHAT, {"messages": [{"role": "user", "content": "Tell me a story."}]})
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == 64


def test_choices_that_together_overfill_the_pool_take_turns(pool64: LiveServer) -> None:
    # Each choice needs 60 of the 64 tokens: the second is preempted, waits for the first, then recomputes.
    reply = post(pool64.url + CMPL, {"prompt": tokens(20), "max_tokens": 40, "n": 2, "ignore_eos": True})
    assert reply.status == 200, reply.body
    choices = reply.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["length", "length"]


def test_a_request_preempted_past_the_bound_gets_a_retryable_503(pool16_no_preemption: LiveServer) -> None:
    server = pool16_no_preemption
    body = {"prompt": tokens(6), "max_tokens": 10, "n": 2, "ignore_eos": True}  # 2 choices of 16 tokens
    reply = post(server.url + CMPL, body)
    assert reply.status == 503, reply.body
    error = reply.error()
    assert error["code"] == "kv_cache_exhausted" and error["type"] == "service_unavailable"
    assert "too small" in error["message"] and reply.headers["Retry-After"] == "1"
    after = post(server.url + CMPL, {"prompt": tokens(6), "max_tokens": 10, "ignore_eos": True})
    assert after.status == 200, after.body


def test_a_stream_preempted_past_the_bound_ends_with_an_error_event(pool16_no_preemption: LiveServer) -> None:
    body = {"prompt": tokens(6), "max_tokens": 10, "n": 2, "ignore_eos": True, "stream": True}
    reply = post(pool16_no_preemption.url + CMPL, body)
    assert reply.status == 200  # the headers went out with the first tokens
    events = sse_events(reply.body)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "kv_cache_exhausted"
    stats = pool16_no_preemption.stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv.used_blocks == 0
