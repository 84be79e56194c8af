"""CORS for browser clients: off unless `service.cors_allow_origins` names origins.

An allowed origin's preflight (OPTIONS with Access-Control-Request-Method) is answered 204 before auth, since
browsers send it without credentials; a refused one gets 403. Every answer to an allowed origin carries the
CORS headers, streams included (added as the response is prepared). With "*" any origin is allowed but
credentials never are; a listed origin is echoed back, with credentials allowed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from service.config.settings import ANY_ORIGIN as ANY
from service.openai.errors import APIError

METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, X-Request-Id, traceparent, tracestate"
EXPOSED_HEADERS = "X-Request-Id, Retry-After"
MAX_AGE_S = "600"
PrepareHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


def allowed(origins: tuple[str, ...], origin: str | None) -> bool:
    return origin is not None and (ANY in origins or origin in origins)


def cors_middleware(origins: tuple[str, ...]) -> Middleware:
    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (origins and request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers):
            return await handler(request)
        if not allowed(origins, request.headers.get("Origin")):
            raise APIError(403, "this origin may not call this server (see service.cors_allow_origins)",
                           "permission_error", code="cors_origin_refused")
        return web.Response(status=204, headers={"Access-Control-Allow-Methods": METHODS,
                                                 "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                                                 "Access-Control-Max-Age": MAX_AGE_S})

    return preflight


def cors_headers(origins: tuple[str, ...]) -> PrepareHook:
    async def add(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if not allowed(origins, origin):
            return
        if ANY in origins:
            response.headers["Access-Control-Allow-Origin"] = ANY
        else:
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers.add("Vary", "Origin")
        response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS

    return add
