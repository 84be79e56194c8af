"""The request middlewares: OpenAI-shaped errors (and a clean 500 for bugs), the protocol's refusals, API-key
auth, request counting, and CORS for browser clients (app/server.py orders them).

CORS is off unless `service.cors_allow_origins` names origins. An allowed origin's preflight (OPTIONS with
Access-Control-Request-Method) is answered 204 before auth, since browsers send it without credentials; a
refused one gets 403. Every answer to an allowed origin carries the CORS headers, streams included (added as the
response is prepared). With "*" any origin is allowed but credentials never are; a listed origin is echoed
back, with credentials allowed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter

from service.config.settings import ANY_ORIGIN as ANY
from service.http.auth import authorized, needs_key
from service.http.ids import REQUEST_ID_KEY
from service.http.protocol import REFUSAL_KEY
from service.openai.errors import INVALID, APIError, server_error

log = logging.getLogger(__name__)
_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: INVALID, 413: INVALID}
_KEPT_HEADERS = ("Allow",)
METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, X-Request-Id, traceparent, tracestate"
EXPOSED_HEADERS = "X-Request-Id, Retry-After"
MAX_AGE_S = "600"
PrepareHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


def error_middleware() -> Middleware:
    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as exc:
            if exc.detail:
                log.info("%s %s, request %s: %s (%s)", request.method, request.path,
                         request.get(REQUEST_ID_KEY), exc.message, exc.detail)
            return exc.response()
        except web.HTTPException as exc:  # raised by aiohttp itself: no such route, wrong method, ...
            if exc.status < 400:
                raise
            kept = {k: v for k, v in exc.headers.items() if k in _KEPT_HEADERS}  # 405's Allow
            return APIError(exc.status, exc.reason, _HTTP_TYPES.get(exc.status, INVALID), headers=kept).response()
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            return server_error("internal server error").response()

    return errors


def screening_middleware() -> Middleware:
    """Answers a request the protocol screened out (service.http.protocol.screen) before anything else runs."""

    @web.middleware
    async def screened(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = request.get(REFUSAL_KEY)
        if refusal is not None:
            raise refusal
        return await handler(request)

    return screened


def auth_middleware(keys: tuple[bytes, ...]) -> Middleware:
    """The routes auth.needs_key names need a key when keys are configured."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if keys and needs_key(request.path) and not authorized(request.headers.get("Authorization"),
                                                                         keys):
            raise APIError(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')",
                           "authentication_error", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return auth


def counting_middleware(counter: Counter) -> Middleware:
    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        counter.labels(request.method, route, str(resp.status)).inc()
        return resp

    return count


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
