"""Over real HTTP on the sim backend: a poisoned request in a batch of 8 fails alone and the 7 others get the
text they get alone; /health (readiness) answers 503 "degraded" while most recent steps fail or a step is
stalled, and 200 again once steps succeed; /health/live stays 200 meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from backends.model.loader import ModelFiles
from scheduler.config import SchedulerConfig
from tests.reliability.fault_servers import CMPL, completion, fault_server, wait_for_count
from tests.service.live import LiveServer
from tests.service.rawhttp import post, request
from tests.waiting import until, wait_until


def texts_at_once(server: LiveServer, prompts: list[str]) -> list[tuple[int, Any]]:
    async def many() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            async def one(text: str) -> tuple[int, Any]:
                body = {"prompt": text, "max_tokens": 8, "temperature": 0.8, "seed": 7}
                async with session.post(server.url + CMPL, json=body) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one(p) for p in prompts))

    return asyncio.run(many())


def alone(server: LiveServer, text: str) -> str:
    reply = post(server.url + CMPL, {"prompt": text, "max_tokens": 8, "temperature": 0.8, "seed": 7})
    assert reply.status == 200
    return str(reply.json()["choices"][0]["text"])


def test_a_poisoned_request_in_a_batch_of_8_fails_alone(model_files: ModelFiles, servers: list[LiveServer]
                                                        ) -> None:
    # sequence 3 is the fourth request to arrive, whichever it is; the ones sent alone afterwards are clean
    server = fault_server(model_files, "poison@3", profile="cpu")
    servers.append(server)
    prompts = [f"tale number {i} begins" for i in range(8)]
    replies = texts_at_once(server, prompts)
    failed = [i for i, (status, _) in enumerate(replies) if status != 200]
    assert len(failed) == 1 and "injected poison" in replies[failed[0]][1]["error"]["message"]
    assert replies[failed[0]][0] == 500 and replies[failed[0]][1]["error"]["code"] == "engine_error"
    for i, (status, body) in enumerate(replies):
        if status == 200:
            assert body["choices"][0]["text"] == alone(server, prompts[i]), i
    assert request("GET", server.url + "/health").status == 200  # one bad request does not degrade the server
    assert server.stats().kv.used_blocks == 0


def health(server: LiveServer, path: str = "/health") -> tuple[int, Any]:
    reply = request("GET", server.url + path)
    return reply.status, reply.json()


def test_health_is_degraded_while_most_steps_fail_and_ready_once_they_succeed(model_files: ModelFiles,
                                                                               servers: list[LiveServer]) -> None:
    # one request at a time, two steps each: steps 2, 3 and 4 fail (3 of the first 4), fewer than 5 in a row
    server = fault_server(model_files, "step_error@2,step_error@3,step_error@4")
    servers.append(server)
    assert [completion(server).status for _ in range(3)] == [500, 500, 500]
    status, body = health(server)
    assert status == 503 and body == {"status": "degraded",
                                      "reason": "3 of the 4 engine steps of the last 30 s failed"}
    assert health(server, "/health/live") == (200, {"status": "ready"})
    assert completion(server).status == 200  # still serving: degraded only steers traffic away
    assert health(server)[0] == 503  # 3 of 6 steps failed: still half
    assert completion(server).status == 200
    assert health(server) == (200, {"status": "ready"})  # 3 of 8


def test_a_stalled_step_is_reported_before_the_watchdog_gives_up(model_files: ModelFiles,
                                                                 servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "hang:2@3", step_timeout_s=30.0, stall_report_s=0.5)
    servers.append(server)

    async def scenario() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            stream = await session.post(server.url + CMPL, json={"prompt": "Hi", "max_tokens": 6, "stream": True})
            await stream.content.readuntil(b"\n\n")  # a first token: step 1 is done, the hang (2 s) is near

            async def get(path: str) -> tuple[int, Any]:
                async with session.get(server.url + path) as reply:
                    return reply.status, await reply.json()

            async def degraded() -> bool:
                return (await get("/health"))[0] == 503

            await until(degraded, timeout=1.5, what="/health 503 once the step runs past stall_report_s")
            assert (await get("/health/live"))[0] == 200
            stalled = await get("/health")
            await stream.read()
            return stalled

    status, body = asyncio.run(scenario())
    assert status == 503 and body["status"] == "degraded" and "the running engine step has taken" in body["reason"]
    wait_until(lambda: health(server)[0] == 200, what="/health 200 once the step returned")
    assert completion(server).status == 200 and server.engine.failure is None


def test_the_engine_failing_fails_liveness_too(model_files: ModelFiles, servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "hang@3", step_timeout_s=0.5)
    servers.append(server)
    completion(server, max_tokens=5)
    wait_for_count(server, "hang", 1.0)
    assert health(server, "/health/live") == (503, {"status": "unhealthy"})


def test_every_step_failing_degrades_health_then_fails_the_engine(model_files: ModelFiles,
                                                                  servers: list[LiveServer]) -> None:
    server = fault_server(model_files, "step_error%100", scheduler=SchedulerConfig(max_num_seqs=1))
    servers.append(server)
    assert [completion(server).status for _ in range(3)] == [500] * 3
    assert health(server)[1]["status"] == "degraded"  # before the fifth failure in a row fails the engine
    assert completion(server).status == 500
    assert completion(server).status in (500, 503)  # the fifth in a row: the engine fails as the step does
    wait_until(lambda: health(server) == (503, {"status": "unhealthy"}), what="/health unhealthy")
