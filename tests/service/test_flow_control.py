"""Disconnect = abort, backpressure, per-request timeouts and mid-stream engine failures, on the real engine
with the sim backend spending real time per step (the "cpu" profile: tens of ms per step)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from backends.base import StepBatch, StepOutput
from backends.model.loader import ModelFiles
from service.app.assemble import build_engine, build_parts
from service.config.settings import AppConfig, ServiceConfig
from service.generation.state import Runtime
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, sse_events
from tests.waiting import wait_until

LONG = {"prompt": "Tell me a long story", "max_tokens": 2000, "stream": True}


@pytest.fixture(scope="module")
def slow_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    config = sim_config(ServiceConfig(port=0), profile="cpu", max_num_seqs=1, max_waiting_requests=1)
    server = LiveServer.start(config, cached_builder(model_files))
    yield server
    server.close()


async def read_chunks(resp: aiohttp.ClientResponse, count: int) -> None:
    seen = 0
    async for line in resp.content:
        seen += line.startswith(b"data: ")
        if seen >= count:
            return


def idle(server: LiveServer) -> bool:
    stats = server.stats()
    return bool(stats.num_running == 0 and stats.num_waiting == 0 and stats.kv.used_blocks == 0)


def test_disconnect_aborts_and_frees_kv_blocks(slow_server: LiveServer) -> None:
    async def stream_then_hang_up() -> None:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(slow_server.url + "/v1/completions", json=LONG)
            await read_chunks(resp, 3)
            stats = slow_server.stats()
            assert stats.num_running == 1 and stats.kv.used_blocks > 0
            resp.close()  # drops the connection mid-stream

    asyncio.run(stream_then_hang_up())
    wait_until(lambda: idle(slow_server), what="idle")


def test_disconnect_before_an_unstreamed_answer_aborts(slow_server: LiveServer) -> None:
    async def give_up() -> None:
        timeout = aiohttp.ClientTimeout(total=0.5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(slow_server.url + "/v1/completions", json={**LONG, "stream": False})

    asyncio.run(give_up())
    wait_until(lambda: idle(slow_server), what="idle")


def test_full_queue_answers_503_with_retry_after(slow_server: LiveServer) -> None:
    async def scenario() -> tuple[int, str | None, dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            running = await session.post(slow_server.url + "/v1/completions", json=LONG)
            await read_chunks(running, 1)
            waiting = asyncio.create_task(session.post(slow_server.url + "/v1/completions", json=LONG))
            await asyncio.to_thread(wait_until, lambda: slow_server.stats().num_waiting == 1)
            async with session.post(slow_server.url + "/v1/completions", json=LONG) as refused:
                result = refused.status, refused.headers.get("Retry-After"), await refused.json()
            running.close()
            (await waiting).close()
            return result

    status, retry_after, body = asyncio.run(scenario())
    assert status == 503 and retry_after is not None and int(retry_after) >= 1
    assert body["error"]["code"] == "queue_full"
    wait_until(lambda: idle(slow_server), what="idle")
    assert post(slow_server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).status == 200


@pytest.fixture(scope="module")
def impatient_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    server = LiveServer.start(sim_config(ServiceConfig(port=0, request_timeout_s=0.3), profile="cpu"),
                              cached_builder(model_files))
    yield server
    server.close()


def test_timeout_unstreamed_is_504_and_aborts(impatient_server: LiveServer) -> None:
    reply = post(impatient_server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 500})
    assert reply.status == 504 and reply.error()["code"] == "request_timeout"
    wait_until(lambda: idle(impatient_server), what="idle")


def test_timeout_streamed_ends_with_error_event(impatient_server: LiveServer) -> None:
    reply = post(impatient_server.url + "/v1/completions", {**LONG, "max_tokens": 500})
    events = sse_events(reply.body)
    assert reply.status == 200 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "request_timeout"
    wait_until(lambda: idle(impatient_server), what="idle")


class FailingBackend:
    """Delegates to a real backend but raises on the `fail_at`-th step."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self._inner = inner
        self._steps = 0
        self._fail_at = fail_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, batch: StepBatch) -> StepOutput:
        self._steps += 1
        if self._steps == self._fail_at:
            raise RuntimeError("simulated device fault")
        return self._inner.execute(batch)


async def _failing_runtime(config: AppConfig, files: ModelFiles) -> Runtime:
    parts = build_parts(config, files)
    parts = replace(parts, backend=FailingBackend(parts.backend, fail_at=4))
    return Runtime(build_engine(config, parts), files.tokenizer, files.chat_template)


def test_engine_failure_mid_stream_is_an_error_event(model_files: ModelFiles) -> None:
    server = LiveServer.start(sim_config(), functools.partial(_failing_runtime, files=model_files))
    try:
        reply = post(server.url + "/v1/completions", {**LONG, "max_tokens": 20})
        events = sse_events(reply.body)
        assert reply.status == 200 and events[-1] == "[DONE]"
        assert any("choices" in e for e in events[:-2])
        assert events[-2]["error"]["type"] == "server_error" and "device fault" in events[-2]["error"]["message"]
        after = post(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        assert after.status == 200
    finally:
        server.close()
