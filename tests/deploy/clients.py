"""Clients through Envoy: streamed and plain completions, and what came of each."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from tests.service.rawhttp import sse_events

MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: no HTTP answer at all
    body: bytes = b""
    broken: bool = False  # the connection ended before the response did

    @property
    def complete_stream(self) -> bool:
        """A 200 stream that ran to its end: a finish reason, [DONE], and no error event."""
        if self.status != 200 or self.broken:
            return False
        events = sse_events(self.body)
        finished = any(isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"] for e in events)
        errors = any(isinstance(e, dict) and "error" in e for e in events)
        return finished and not errors and events[-1:] == ["[DONE]"]


def body(tokens: int, stream: bool, prompt: str = "Tell me a story") -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "stream": stream,
            "temperature": 0}


async def complete(session: aiohttp.ClientSession, url: str, tokens: int, stream: bool = False,
                   session_id: str | None = None, prompt: str = "Tell me a story") -> Outcome:
    headers = {"X-Session-Id": session_id} if session_id else {}
    try:
        async with session.post(url + "/v1/completions", json=body(tokens, stream, prompt), headers=headers) as r:
            try:
                return Outcome(r.status, await r.read())
            except aiohttp.ClientPayloadError:
                return Outcome(r.status, broken=True)
    except (aiohttp.ClientError, OSError):
        return Outcome(0, broken=True)


async def many(url: str, count: int, tokens: int, stream: bool = False, every_s: float = 0.0) -> list[Outcome]:
    """`count` requests, each on its own connection, one every `every_s` seconds (the arrival rate of the load,
    not a wait for anything), all in flight together when they outlast the arrivals."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        sent = []
        for _ in range(count):
            sent.append(asyncio.create_task(complete(session, url, tokens, stream)))
            await asyncio.sleep(every_s)
        return list(await asyncio.gather(*sent))
