"""A real `pagedserve serve` process whose engine fails: /health turns 503, the cause is logged once, the stream
in flight ends with an error event, and the process exits with status 3 for its supervisor to restart it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from service.app.server import EXIT_ENGINE_FAILED
from tests.service.process import ServerProcess, serve_process
from tests.service.rawhttp import sse_events
from tests.waiting import until

STEP_TIMEOUT_S = 1.0


async def _stream_into_the_hang(server: ServerProcess) -> list[Any]:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "Hi", "max_tokens": 100, "stream": True}
        async with session.post(server.url + "/v1/completions", json=body) as stream:
            await stream.content.readuntil(b"\n\n")

            async def unhealthy() -> bool:
                async with session.get(server.url + "/health") as health:
                    return health.status == 503

            # the hang has no end of its own: only the watchdog turns /health 503 (a generous 5 s past its limit)
            await until(unhealthy, timeout=STEP_TIMEOUT_S + 5.0, what="/health 503 after the watchdog's limit")
            return sse_events(await stream.read())


def test_a_hung_engine_exits_the_process_with_status_3(tmp_path: Path) -> None:
    args = ["--backend", "sim", "--sim-profile", "cpu", "--sim-faults", "hang@4",
            "--step-timeout-s", str(STEP_TIMEOUT_S), "--log-level", "warning"]
    with serve_process(tmp_path / "server.log", args) as server:
        events = asyncio.run(_stream_into_the_hang(server))
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_failed"
        assert server.proc.wait(timeout=15) == EXIT_ENGINE_FAILED
    log = server.output()
    assert log.count("CRITICAL") == 1 and "did not finish within 1 s" in log
    assert "error: the engine failed, exiting" in log and "Traceback" not in log
