"""service.http.body's checks on requests built in memory: what the loopback tests cannot easily provoke."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from service.http.body import read_body
from service.openai.errors import APIError, printable

JSON = {"Content-Type": "application/json"}


def _read(headers: dict[str, str], feed: bytes | None = None, error: Exception | None = None,
          timeout_s: float = 1.0) -> bytes:
    async def scenario() -> bytes:
        payload = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
        if error is not None:
            payload.set_exception(error)
        elif feed is not None:
            payload.feed_data(feed)
            payload.feed_eof()
        request = make_mocked_request("POST", "/v1/completions", headers=CIMultiDict(headers), payload=payload)
        return await read_body(request, 1024, timeout_s)

    return asyncio.run(scenario())


def _refused(status: int, code: str, headers: dict[str, str], error: Exception | None = None,
             timeout_s: float = 1.0) -> None:
    with pytest.raises(APIError) as raised:
        _read(headers, b"{}", error, timeout_s)
    assert raised.value.status == status and raised.value.code == code


def test_a_body_is_read() -> None:
    assert _read(JSON, b'{"prompt": "a"}') == b'{"prompt": "a"}'


def test_a_stalled_body_is_408_and_closes_the_connection() -> None:
    with pytest.raises(APIError) as raised:
        _read(JSON, None, timeout_s=0.05)  # headers came, the body never does
    error = raised.value
    assert error.status == 408 and error.code == "request_timeout"
    assert error.close and error.response().keep_alive is False


def test_a_broken_payload_is_400() -> None:
    _refused(400, "malformed_request", JSON, web.RequestPayloadError("bad chunk"))


def test_content_checks_come_before_reading() -> None:
    _refused(415, "unsupported_content_encoding", {**JSON, "Content-Encoding": "gzip"})
    _refused(415, "unsupported_media_type", {"Content-Type": "text/plain"})
    assert printable("text/\udcff") == "text/\\udcff"  # undecodable header bytes, echoed safely
