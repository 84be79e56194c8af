"""Small synchronous wrappers over aiohttp's client for raw-HTTP tests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        payload = self.json()
        assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
        return payload["error"]


async def request_async(method: str, url: str, body: bytes | None = None,
                        headers: dict[str, str] | None = None) -> Reply:
    async with aiohttp.ClientSession() as session, session.request(method, url, data=body, headers=headers) as r:
        return Reply(r.status, dict(r.headers), await r.read())


def request(method: str, url: str, body: bytes | Any = None, headers: dict[str, str] | None = None) -> Reply:
    raw = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    return asyncio.run(request_async(method, url, raw, headers))


def post(url: str, body: bytes | Any, headers: dict[str, str] | None = None) -> Reply:
    return request("POST", url, body, {"Content-Type": "application/json", **(headers or {})})


def sse_events(body: bytes) -> list[Any]:
    """The data payloads of an SSE body, JSON-decoded ([DONE] kept as the string)."""
    events = [line[len(b"data: "):] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]
