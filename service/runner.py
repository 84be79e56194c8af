"""An AppRunner whose connections are GuardedProtocols, with the service's HTTP limits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader

from service.config import ServiceConfig
from service.protocol import REFUSAL_KEY, GuardedProtocol, screen

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
        auto_decompress=False,  # compressed bodies are refused (service.body), never inflated
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
    and to screen what it parsed (service.protocol.screen)."""

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
