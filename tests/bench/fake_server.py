"""A scripted OpenAI-style streaming server on loopback: known chunk timings, recorded requests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@dataclass
class Script:
    first_s: float = 0.0  # before the first text chunk
    gap_s: float = 0.0  # between text chunks
    status: int = 200
    usage: bool = True
    error_event: bool = False  # end with an in-band error instead of usage
    close_after_stream: bool = False  # close the connection after each stream, saying nothing (as cpp-httplib)
    arrivals: list[float] = field(default_factory=list)  # monotonic time each request came in
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def _text_chunk(chat: bool, i: int) -> dict[str, Any]:
    if chat:
        return {"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
    return {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}


async def _handle(request: web.Request, script: Script) -> web.StreamResponse:
    script.arrivals.append(time.perf_counter())
    body = await request.json()
    script.bodies.append(body)
    script.headers.append(dict(request.headers))
    if script.status != 200:
        return web.json_response({"error": {"message": "busy", "code": "queue_full"}}, status=script.status)
    script.in_flight += 1
    script.max_in_flight = max(script.max_in_flight, script.in_flight)
    try:
        return await _stream(request, script, body)
    finally:
        script.in_flight -= 1


async def _stream(request: web.Request, script: Script, body: dict[str, Any]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chat = "messages" in body
    if chat:
        await resp.write(sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    await asyncio.sleep(script.first_s)
    n = int(body["max_tokens"])
    for i in range(n):
        if i:
            await asyncio.sleep(script.gap_s)
        await resp.write(sse(_text_chunk(chat, i)))
    if script.error_event:
        await resp.write(sse({"error": {"message": "engine died", "type": "server_error", "code": "engine_error"}}))
    elif script.usage:
        await resp.write(sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}))
    await resp.write(b"data: [DONE]\n\n")
    if script.close_after_stream and request.transport is not None:
        await resp.write_eof()
        request.transport.close()
    return resp


@asynccontextmanager
async def serving(script: Script) -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _handle(request, script)

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
