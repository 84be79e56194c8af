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


async def exchange(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; return all the server sends until it closes the connection."""
    reader, writer = await open_raw(url)
    try:
        writer.write(data)
        async with asyncio.timeout(timeout):
            return await reader.read()
    finally:
        writer.close()


async def open_raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def parse_reply(raw: bytes) -> Reply:
    """One HTTP/1.1 response with a Content-Length body, from its raw bytes."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return Reply(int(status_line.split()[1]), headers, rest[:int(headers.get("Content-Length", len(rest)))])
