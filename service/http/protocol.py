"""The HTTP/1.1 connection: aiohttp's protocol plus a deadline on request headers, OpenAI-shaped answers to
requests aiohttp could not parse, and the runner that serves the app on such connections with the service's
HTTP limits (`make_runner`).

aiohttp's only clock on a connection waiting for a request is its keep-alive timer, sized for proxies that
reuse idle connections (minutes), not for a client that stalls or trickles its headers a byte at a time to
hold connections (slowloris). Here the headers of each request must be complete within `header_timeout` of
the connection opening (for its first request) or of the request's first byte (for later ones); otherwise the
connection is closed without an answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy

from service.config.settings import ServiceConfig
from service.openai.errors import APIError, printable

log = logging.getLogger(__name__)
# A request's entry: the error its parsed message already earned (see screen()).
REFUSAL_KEY = web.RequestKey("pagedserve.refusal", APIError)
RequestFactory = Callable[..., web.BaseRequest]
SHUTDOWN_GRACE_S = 5.0  # after the drain, how long aiohttp waits for handlers to write their last bytes


def make_runner(app: web.Application, service: ServiceConfig) -> web.AppRunner:
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its requests.
    # lingering_time: how long a body the app did not read (an early error) is drained before closing; a
    # client slower than read_timeout_s is not waited for here either.
    return GuardedRunner(
        app, service.read_timeout_s, handler_cancellation=True, shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=logging.getLogger("service.access"), keepalive_timeout=service.keepalive_timeout_s,
        lingering_time=service.read_timeout_s, max_line_size=service.max_header_bytes,
        max_field_size=service.max_header_bytes, max_headers=service.max_headers,
        auto_decompress=False,  # compressed bodies are refused (service.http.body), never inflated
    )


class GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self._header_timeout)


class GuardedServer(web.Server):
    """The server aiohttp made for the app (same handler and settings), making GuardedProtocols."""

    def __init__(self, plain: web.Server, header_timeout: float) -> None:
        super().__init__(plain.request_handler, request_factory=_announcing(plain.request_factory),
                         handler_cancellation=plain.handler_cancellation, loop=plain._loop, **plain._kwargs)
        self._header_timeout = header_timeout

    def __call__(self) -> GuardedProtocol:
        return GuardedProtocol(self, header_timeout=self._header_timeout, loop=self._loop, **self._kwargs)


def _announcing(factory: RequestFactory) -> RequestFactory:
    """aiohttp builds a request once its headers are parsed: the moment to stop the connection's header clock,
    and to screen what it parsed (screen() below)."""

    def make(message: RawRequestMessage, payload: StreamReader, protocol: web.RequestHandler,
             writer: AbstractStreamWriter, task: asyncio.Task[None]) -> web.BaseRequest:
        if isinstance(protocol, GuardedProtocol):
            protocol.headers_received()
        message, refusal = screen(message)
        request = factory(message, payload, protocol, writer, task)
        if refusal is not None:
            request[REFUSAL_KEY] = refusal
        return request

    return make


class GuardedProtocol(web.RequestHandler):
    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._between_requests = True  # the next byte starts a request, whose headers are then on the clock

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()  # a client that connects and sends nothing is on the clock too

    def data_received(self, data: bytes) -> None:
        if self._between_requests and self._header_timer is None:
            self._arm()
        super().data_received(data)

    def headers_received(self) -> None:
        """A request's headers are parsed: from here its body has its own deadline (service.http.body)."""
        self._between_requests = False
        self._disarm()

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        try:
            done = await super().finish_response(request, resp, start_time)
        finally:
            self._between_requests = True
        if resp.status == 408:  # the body stalled: no lingering for the rest of it, close once the 408 is out
            self.force_close()
        return done

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (status 400) or a failure outside the app's middlewares."""
        error = protocol_error(status, exc, message)
        if status >= 500:
            self.log_exception("error handling request from %s", request.remote, exc_info=exc)
        else:  # the client's mistake, not ours: one line, no traceback
            log.debug("malformed request from %s: %s", request.remote, error.message)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun: no error response can follow")
        return error.response()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self._header_timeout, self._headers_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        log.debug("closing a connection: request headers not received within %g s", self._header_timeout)
        self.force_close()


def protocol_error(status: int, exc: BaseException | None, message: str | None) -> APIError:
    """The answer, after which aiohttp closes the connection: what follows the bad bytes cannot be framed."""
    if status >= 500:
        return APIError(status, "internal server error", "server_error", code="internal_error", close=True)
    text = printable(_one_line(message or str(exc or "malformed request")))
    if isinstance(exc, LineTooLong) or text.startswith("Too many headers"):
        return APIError(431, f"request header fields too large: {text}", code="headers_too_large", close=True)
    return APIError(400, f"malformed HTTP request: {text}", code="malformed_request", close=True)


def _one_line(message: str) -> str:
    """aiohttp's parser messages span lines and point at the error with a caret line; keep the words."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip().strip("^"))


def screen(message: RawRequestMessage) -> tuple[RawRequestMessage, APIError | None]:
    """What aiohttp parses but this server does not speak, and which aiohttp would answer in its own way (a
    status line in the request's version, a text/plain 417): the message made safe to answer, and the error
    to answer it with (raised by service.http.middleware before anything else looks at the request)."""
    if message.version not in (HttpVersion10, HttpVersion11):
        version = f"{message.version.major}.{message.version.minor}"
        # 400, not 505: a client's mistake, answered as aiohttp answers other versions it cannot parse
        return message._replace(version=HttpVersion11, should_close=True), APIError(
            400, f"HTTP/{version} is not supported (HTTP/1.0 and HTTP/1.1 are)", code="unsupported_http_version",
            close=True)
    expect = message.headers.get("Expect")
    if expect is not None and expect.lower() != "100-continue":
        headers = CIMultiDict(message.headers)
        headers.popall("Expect")
        return message._replace(headers=CIMultiDictProxy(headers), should_close=True), APIError(
            417, f"unsupported expectation {printable(expect)!r} (only 100-continue is)", code="expectation_failed",
            close=True)
    return message, None
