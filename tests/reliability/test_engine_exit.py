"""A real `pagedserve serve` process whose engine fails: /health turns 503, the cause is logged once, the stream
in flight ends with an error event, and the process exits with status 3 for its supervisor to restart it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from service.server import EXIT_ENGINE_FAILED
from tests.service.process import ServerProcess, serve_process
from tests.service.rawhttp import sse_events

STEP_TIMEOUT_S = 1.0


async def _stream_into_the_hang(server: ServerProcess) -> tuple[list[Any], float, int]:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "Hi", "max_tokens": 100, "stream": True}
        async with session.post(server.url + "/v1/completions", json=body) as stream:
            await stream.content.readuntil(b"\n\n")
            start, status = time.monotonic(), 200
            while status == 200:
                async with session.get(server.url + "/health") as health:
                    status = health.status
                await asyncio.sleep(0.05)
            return sse_events(await stream.read()), time.monotonic() - start, status


def test_a_hung_engine_exits_the_process_with_status_3(tmp_path: Path) -> None:
    args = ["--backend", "sim", "--sim-profile", "cpu", "--sim-faults", "hang@4",
            "--step-timeout-s", str(STEP_TIMEOUT_S), "--log-level", "warning"]
    with serve_process(tmp_path / "server.log", args) as server:
        events, took, health = asyncio.run(_stream_into_the_hang(server))
        assert health == 503 and took < STEP_TIMEOUT_S + 1.0
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_failed"
        assert server.proc.wait(timeout=15) == EXIT_ENGINE_FAILED
    log = server.output()
    assert log.count("CRITICAL") == 1 and "did not finish within 1 s" in log
    assert "error: the engine failed, exiting" in log and "Traceback" not in log
