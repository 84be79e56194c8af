"""HTTP-level defences over real loopback sockets: deadlines on headers and bodies, idle keep-alive, header
limits, and OpenAI error JSON for requests aiohttp cannot parse. Each case checks that the server still
serves afterwards."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import Reply, exchange, open_raw, parse_reply, post, sse_events

READ_S = 0.3
KEEPALIVE_S = 1.5  # far enough past READ_S that a wait tells which deadline ended it, even on a busy machine
CMPL = "/v1/completions"


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    """Short deadlines, and the "cpu" sim profile (about 20 ms a token), so a stream can outlast them."""
    service = ServiceConfig(port=0, read_timeout_s=READ_S, keepalive_timeout_s=KEEPALIVE_S, max_headers=20,
                            max_header_bytes=2048)
    live = LiveServer.start(sim_config(service, profile="cpu"), cached_builder(model_files))
    yield live
    live.close()


def _still_serves(server: LiveServer) -> None:
    ok = post(server.url + CMPL, {"prompt": "Hello", "max_tokens": 2})
    assert ok.status == 200, ok.body
    assert ok.json()["usage"]["completion_tokens"] == 2


def _error(reply: Reply, status: int, code: str) -> dict[str, object]:
    assert reply.status == status, reply
    assert reply.headers["Content-Type"].startswith("application/json")
    error = reply.error()
    assert error["code"] == code and error["message"] and error["type"] == "invalid_request_error"
    return error


def _head(path: str = CMPL, *extra: str, method: str = "POST") -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: test", *extra, "", ""]).encode()


async def _closed_after(server: LiveServer, sent: bytes, trickle: bytes = b"", every_s: float = 0.05) -> float:
    """Send `sent`, then `trickle` a byte at a time; seconds until the server closes without answering."""
    reader, writer = await open_raw(server.url)
    start = time.monotonic()
    writer.write(sent)
    feeder = asyncio.create_task(_trickle(writer, trickle, every_s))
    try:
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed, and not a byte of answer
        return time.monotonic() - start
    finally:
        feeder.cancel()
        writer.close()


async def _read_reply(reader: asyncio.StreamReader) -> Reply:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(parse_reply(head).headers["Content-Length"])
    return parse_reply(head + await reader.readexactly(length))


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    for i in range(len(data)):
        await asyncio.sleep(every_s)
        writer.write(data[i:i + 1])


def test_a_silent_connection_is_closed_after_the_read_timeout(server: LiveServer) -> None:
    waited = asyncio.run(_closed_after(server, b""))
    assert READ_S * 0.9 <= waited < KEEPALIVE_S  # the header deadline, not the idle one
    _still_serves(server)


def test_headers_trickled_a_byte_at_a_time_are_cut_off(server: LiveServer) -> None:
    trickle = b"X-Slow: " + b"a" * 200  # 10 s at this pace
    waited = asyncio.run(_closed_after(server, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n", trickle))
    assert READ_S * 0.9 <= waited < KEEPALIVE_S
    _still_serves(server)


def test_the_next_request_on_a_kept_alive_connection_has_the_same_deadline(server: LiveServer) -> None:
    async def scenario() -> tuple[float, float]:
        reader, writer = await open_raw(server.url)
        writer.write(_head("/health", method="GET"))
        assert (await _read_reply(reader)).status == 200
        start = time.monotonic()
        writer.write(b"GET /health HTTP/1.1\r\n")  # the next request begins, and stalls
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        return time.monotonic() - start, READ_S

    waited, deadline = asyncio.run(scenario())
    assert deadline * 0.9 <= waited < KEEPALIVE_S


def test_an_idle_kept_alive_connection_lives_past_the_read_timeout_then_closes(server: LiveServer) -> None:
    async def scenario() -> tuple[bool, float]:
        reader, writer = await open_raw(server.url)
        writer.write(_head("/health", method="GET"))
        assert (await _read_reply(reader)).status == 200
        start = time.monotonic()
        await asyncio.sleep(READ_S * 2)
        writer.write(_head("/health", method="GET"))  # still open: a second request is answered
        reused = (await _read_reply(reader)).status == 200
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        return reused, time.monotonic() - start

    reused, lived = asyncio.run(scenario())
    assert reused and lived >= KEEPALIVE_S * 0.9


def test_a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes(server: LiveServer) -> None:
    async def scenario() -> tuple[bytes, float]:
        reader, writer = await open_raw(server.url)
        start = time.monotonic()
        writer.write(_head(CMPL, "Content-Type: application/json", "Content-Length: 100") + b'{"prompt": ')
        async with asyncio.timeout(5):
            raw = await reader.read()  # the answer, then the close
        writer.close()
        return raw, time.monotonic() - start

    raw, waited = asyncio.run(scenario())
    reply = parse_reply(raw)
    _error(reply, 408, "request_timeout")
    assert reply.headers["Connection"] == "close" and waited >= READ_S * 0.9
    _still_serves(server)


def test_a_stream_longer_than_every_timeout_completes(server: LiveServer) -> None:
    start = time.monotonic()
    reply = post(server.url + CMPL, {"prompt": "Hi", "max_tokens": 128, "ignore_eos": True, "stream": True,
                                     "stream_options": {"include_usage": True}})
    took = time.monotonic() - start
    events = sse_events(reply.body)
    assert reply.status == 200 and events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 128
    assert took > KEEPALIVE_S > READ_S  # it did outlast them


MALFORMED = [
    # (name, bytes, status, code)
    ("bad request line", b"GARBAGE\r\n\r\n", 400, "malformed_request"),
    ("bad header line", _head("/health", "No colon here", method="GET"), 400, "malformed_request"),
    ("bad chunk size", _head(CMPL, "Content-Type: application/json", "Transfer-Encoding: chunked")
     + b"zz\r\n{}\r\n0\r\n\r\n", 400, "malformed_request"),
    ("too many headers", _head("/health", *(f"X-H{i}: v" for i in range(30)), method="GET"), 431,
     "headers_too_large"),
    ("header too long", _head("/health", "X-Big: " + "a" * 3000, method="GET"), 431, "headers_too_large"),
    ("request line too long", _head("/health?" + "a" * 3000, method="GET"), 431, "headers_too_large"),
]


@pytest.mark.parametrize(("name", "data", "status", "code"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_http_gets_error_json(server: LiveServer, name: str, data: bytes, status: int, code: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        reply = parse_reply(asyncio.run(exchange(server.url, data)))  # answered, then closed
    _error(reply, status, code)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]  # the client's fault
    _still_serves(server)


def test_a_bad_chunk_after_the_headers_were_handled_ends_in_error_json(server: LiveServer) -> None:
    async def scenario() -> bytes:
        reader, writer = await open_raw(server.url)
        writer.write(_head(CMPL, "Content-Type: application/json", "Transfer-Encoding: chunked",
                           "Expect: 100-continue"))
        async with asyncio.timeout(5):
            # the interim answer: the server has handled the headers and now waits for the body
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"zz\r\n{}\r\n0\r\n\r\n")
            raw = await reader.read()
        writer.close()
        return raw

    # The body the handler waits for can never arrive: 408 at the read deadline.
    _error(parse_reply(asyncio.run(scenario())), 408, "request_timeout")
    _still_serves(server)
