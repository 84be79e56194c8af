"""The ids every answer carries, so a client can find its request in the logs and in the traces.

X-Request-Id: the client's (when it is short and plain) or a new one, on every answer, streams included. The
id is read by a middleware before anything else can refuse the request, so even an error carries it.
traceresponse (W3C): the server's request span, on generation answers whose request span is sampled.
Both headers are added as the response is prepared, which covers streamed answers too.
"""

from __future__ import annotations

import re
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from service.openai.errors import bad_request
from telemetry import RequestContext, traceresponse

HEADER = "X-Request-Id"
MAX_LENGTH = 128
_SAFE = re.compile(r"[A-Za-z0-9._:/+=@-]+")
REQUEST_ID_KEY = web.RequestKey("pagedserve.request_id", str)
TRACERESPONSE = "traceresponse"
CLIENT_ID_KEY = web.RequestKey("pagedserve.client_request_id", bool)  # whether the client chose the id


def request_id_middleware() -> Middleware:
    @web.middleware
    async def request_id(request: web.Request, handler: Handler) -> web.StreamResponse:
        sent = request.headers.get(HEADER)
        request[CLIENT_ID_KEY] = sent is not None and valid(sent)
        request[REQUEST_ID_KEY] = sent if sent is not None and valid(sent) else uuid.uuid4().hex
        if sent is not None and not valid(sent):
            return bad_request(f"{HEADER} must be 1 to {MAX_LENGTH} characters of letters, digits and "
                               "._:/+=@-", HEADER).response()
        return await handler(request)

    return request_id


def valid(value: str) -> bool:
    return 0 < len(value) <= MAX_LENGTH and _SAFE.fullmatch(value) is not None


async def add_header(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every answer, of any route and any status, says which request it answers."""
    response.headers[HEADER] = request.get(REQUEST_ID_KEY) or uuid.uuid4().hex


def request_id_of(request: web.Request) -> str:
    return request.get(REQUEST_ID_KEY) or uuid.uuid4().hex


def engine_id(request: web.Request, prefix: str) -> str:
    """The engine's id for the request: unique even when clients send the same X-Request-Id twice."""
    if request.get(CLIENT_ID_KEY):
        return f"{prefix}-{request_id_of(request)}-{uuid.uuid4().hex[:12]}"
    return f"{prefix}-{request_id_of(request)}"


TRACERESPONSE_KEY = web.RequestKey("pagedserve.traceresponse", str)


def remember_traceresponse(request: web.Request, context: RequestContext) -> None:
    """Keep the traceresponse header for `context`'s reserved span; none when tracing is off or the span is not
    sampled."""
    value = traceresponse(context)
    if value is not None:
        request[TRACERESPONSE_KEY] = value


async def add_traceresponse(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: only requests that reserved a request span carry the header."""
    value = request.get(TRACERESPONSE_KEY)
    if value is not None:
        response.headers[TRACERESPONSE] = value
