"""Graceful shutdown of a real `pagedserve serve` process: SIGTERM stops admission (503), lets a short stream
finish, ends a long one with an error event after the drain timeout, and exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.service.process import serve_process
from tests.service.rawhttp import sse_events
from tests.waiting import until

DRAIN_S = 3.0


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    # 512 blocks of 16 tokens hold the long stream's 5000 (a request the pool could never hold is refused).
    args = ["--backend", "sim", "--sim-profile", "cpu", "--num-blocks", "512", "--drain-timeout-s", str(DRAIN_S),
            "--log-level", "warning"]
    with serve_process(tmp_path / "server.log", args) as server:
        yield server.proc, server.url


async def _open_stream(session: aiohttp.ClientSession, url: str, max_tokens: int) -> aiohttp.ClientResponse:
    resp = await session.post(url + "/v1/completions",
                              json={"prompt": "Hi", "max_tokens": max_tokens, "stream": True})
    await resp.content.readuntil(b"\n\n")  # the first chunk: generation has begun
    return resp


async def _scenario(proc: subprocess.Popen[bytes], url: str) -> tuple[list[object], list[object], int]:
    async with aiohttp.ClientSession() as session:
        short = await _open_stream(session, url, max_tokens=4)
        long = await _open_stream(session, url, max_tokens=5000)
        proc.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            async with session.get(url + "/health") as health:
                return health.status == 503

        await until(draining, what="/health 503 after SIGTERM")
        async with session.post(url + "/v1/completions", json={"prompt": "Hi"}) as refused:
            refused_status = refused.status
        short_events = sse_events(await short.read())
        long_events = sse_events(await long.read())
    return short_events, long_events, refused_status


def test_sigterm_drains_then_aborts_and_exits_0(server_process: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = server_process
    short, long, refused = asyncio.run(_scenario(proc, url))  # /health turned 503 first
    assert refused == 503
    assert short[-1] == "[DONE]" and short[-2]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert long[-1] == "[DONE]" and long[-2]["error"]["code"] == "shutting_down"  # type: ignore[index]
    assert proc.wait(timeout=DRAIN_S + 15) == 0
