"""Every injected fault kind over real HTTP: only the requests of the faulty step fail (in OpenAI's error
shapes), the next request succeeds and /metrics counts the failure; a hang (which lasts until the test releases
it) turns /health 503 once the watchdog gives up, within its limit + 5 s, and refuses new work with 503
`engine_failed`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config import AppConfig, ServiceConfig
from tests.service.live import LiveServer, cached_builder
from tests.service.rawhttp import post, request, sse_events
from tests.waiting import until, wait_until

CMPL = "/v1/completions"


def fault_server(files: ModelFiles, faults: str, step_timeout_s: float = 30.0, profile: str = "zero"
                 ) -> LiveServer:
    config = AppConfig(ServiceConfig(port=0, step_timeout_s=step_timeout_s),
                       BackendConfig(name="sim", sim_profile=profile, sim_faults=faults),
                       SchedulerConfig(), KVPoolConfig(num_blocks=256))
    return LiveServer.start(config, cached_builder(files))


@pytest.fixture
def servers() -> Iterator[list[LiveServer]]:
    started: list[LiveServer] = []
    yield started
    for server in started:
        server.engine.backend.faults.release()  # type: ignore[attr-defined]
        server.close()


def completion(server: LiveServer, max_tokens: int = 2, stream: bool = False) -> Any:
    return post(server.url + CMPL, {"prompt": "Hello there", "max_tokens": max_tokens, "stream": stream})


def step_failures(server: LiveServer, cause: str) -> float:
    body = request("GET", server.url + "/metrics").body.decode()
    found = re.search(rf'pagedserve:engine_step_failures_total{{cause="{cause}"}} (\S+)', body)
    return float(found.group(1)) if found else -1.0


def wait_for_count(server: LiveServer, cause: str, expected: float) -> None:
    wait_until(lambda: step_failures(server, cause) == expected, what=f"{cause} failures == {expected}")


# One request at a time with max_tokens 2 takes exactly two steps (prefill + first token, then the second),
# so step 3 belongs to the second request alone.
@pytest.mark.parametrize(("fault", "cause", "message"), [
    ("step_error@3", "backend_error", "injected step_error on step 3"),
    ("bad_token@3", "bad_output", "outside the vocabulary"),
])
def test_a_faulty_step_fails_its_request_only(model_files: ModelFiles, servers: list[LiveServer], fault: str,
                                              cause: str, message: str) -> None:
    server = fault_server(model_files, fault)
    servers.append(server)
    assert completion(server).status == 200
    failed = completion(server)
    assert failed.status == 500 and failed.error()["type"] == "server_error" and message in failed.error()["message"]
    assert failed.error()["code"] == "engine_error"
    after = completion(server)
    assert after.status == 200 and after.json()["usage"]["completion_tokens"] == 2
    assert request("GET", server.url + "/health").status == 200
    wait_for_count(server, cause, 1.0)
    assert server.stats().kv.used_blocks == 0


def test_a_faulty_step_ends_a_stream_with_an_error_event(model_files: ModelFiles, servers: list[LiveServer]
                                                         ) -> None:
    server = fault_server(model_files, "step_error@4")
    servers.append(server)
    events = sse_events(completion(server, max_tokens=10, stream=True).body)
    assert events[-1] == "[DONE]" and "injected step_error" in events[-2]["error"]["message"]
    assert sum(1 for e in events[:-2] if e["choices"][0]["text"]) == 3  # tokens of steps 1-3 went out
    assert completion(server).status == 200


def test_concurrent_neighbours_of_a_faulty_step_still_finish(model_files: ModelFiles,
                                                             servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "step_error@5", profile="cpu")
    servers.append(server)

    async def many() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> tuple[int, Any]:
                async with session.post(server.url + CMPL, json={"prompt": f"story {i}", "max_tokens": 8}) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one(i) for i in range(6)))

    replies = asyncio.run(many())
    failed = [body for status, body in replies if status != 200]
    assert failed and all("injected step_error" in body["error"]["message"] for body in failed)
    assert all(body["usage"]["completion_tokens"] == 8 for status, body in replies if status == 200)
    assert completion(server).status == 200 and server.stats().kv.used_blocks == 0


def test_a_slow_step_only_costs_time(model_files: ModelFiles, servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "slow_step:0.4@2", step_timeout_s=5.0)
    servers.append(server)
    start = time.monotonic()
    assert completion(server).status == 200
    assert time.monotonic() - start >= 0.4
    assert request("GET", server.url + "/health").status == 200


def test_a_hang_turns_health_503_within_the_watchdogs_limit(model_files: ModelFiles,
                                                            servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "hang@3", step_timeout_s=0.5)
    servers.append(server)

    async def scenario() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            stream = await session.post(server.url + CMPL, json={"prompt": "Hi", "max_tokens": 50, "stream": True})
            await stream.content.readuntil(b"\n\n")  # a first token: step 1 is done, the hang is near

            async def unhealthy() -> bool:
                async with session.get(server.url + "/health") as health:
                    return health.status == 503

            await until(unhealthy, timeout=0.5 + 5.0, what="/health 503 once the watchdog gives up")
            return sse_events(await stream.read())

    events = asyncio.run(scenario())
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_failed"
    health = request("GET", server.url + "/health")
    assert health.status == 503 and health.json() == {"status": "unhealthy"} and health.headers["Retry-After"]
    refused = completion(server)
    assert refused.status == 503 and refused.error()["code"] == "engine_failed"
    assert "did not finish within 0.5 s" in refused.error()["message"]
    assert refused.headers["Retry-After"]
    wait_for_count(server, "hang", 1.0)
