"""Every injected fault kind over real HTTP: only the requests of the faulty step fail (in OpenAI's error
shapes), the next request succeeds and /metrics counts the failure; a hang (which lasts until the test releases
it) turns /health 503 once the watchdog gives up, within its limit + 5 s, and refuses new work with 503
`engine_failed`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from backends.model.loader import ModelFiles
from scheduler.config import SchedulerConfig
from tests.reliability.fault_servers import CMPL, completion, fault_server, wait_for_count
from tests.service.live import LiveServer
from tests.service.rawhttp import request, sse_events
from tests.waiting import until


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


def concurrent(server: LiveServer, count: int, max_tokens: int = 8) -> list[tuple[int, Any]]:
    """`count` completions at once, distinct prompts: (status, body) of each."""
    async def many() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> tuple[int, Any]:
                body = {"prompt": f"story {i}", "max_tokens": max_tokens}
                async with session.post(server.url + CMPL, json=body) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one(i) for i in range(count)))

    return asyncio.run(many())


def test_without_re_runs_only_the_faulty_steps_requests_fail(model_files: ModelFiles, servers: list[LiveServer]
                                                             ) -> None:
    # At most 3 sequences a step: of 6 requests at least 3 wait outside the faulty step and must finish.
    server = fault_server(model_files, "step_error@5", profile="cpu",
                          scheduler=SchedulerConfig(max_num_seqs=3, failed_step_retry_s=0))
    servers.append(server)
    replies = concurrent(server, 6)
    failed = [body for status, body in replies if status != 200]
    finished = [body for status, body in replies if status == 200]
    assert 1 <= len(failed) <= 3 and len(failed) + len(finished) == 6
    assert all("injected step_error" in body["error"]["message"] for body in failed)
    assert all(body["usage"]["completion_tokens"] == 8 for body in finished)
    assert completion(server).status == 200 and server.stats().kv.used_blocks == 0


def test_a_passing_fault_in_a_shared_step_fails_no_one(model_files: ModelFiles, servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "step_error@5", profile="cpu")
    servers.append(server)
    replies = concurrent(server, 6)
    assert [status for status, _ in replies] == [200] * 6  # re-run in halves, each half succeeds
    assert all(body["usage"]["completion_tokens"] == 8 for _, body in replies)
    wait_for_count(server, "backend_error", 1.0)
    assert server.stats().kv.used_blocks == 0


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
