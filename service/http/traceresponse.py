"""The W3C `traceresponse` header on generation responses: it names the server's request span, so a client can
find its request's trace. Set as the response is prepared, which covers streamed answers too."""

from __future__ import annotations

from aiohttp import web

from telemetry import RequestContext, traceresponse

HEADER = "traceresponse"
TRACERESPONSE_KEY = web.RequestKey("pagedserve.traceresponse", str)


def remember(request: web.Request, context: RequestContext) -> None:
    """Keep the header for `context`'s reserved span; none when tracing is off or the span is not sampled."""
    value = traceresponse(context)
    if value is not None:
        request[TRACERESPONSE_KEY] = value


async def add_traceresponse(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: only requests that reserved a request span carry the header."""
    value = request.get(TRACERESPONSE_KEY)
    if value is not None:
        response.headers[HEADER] = value
