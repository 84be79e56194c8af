"""Request middlewares: OpenAI-shaped errors (and a clean 500 for bugs), API-key auth, request counting."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import Counter

from service.http.auth import authorized, needs_key
from service.http.protocol import REFUSAL_KEY
from service.http.request_id import REQUEST_ID_KEY
from service.openai.errors import INVALID, APIError, server_error

log = logging.getLogger(__name__)
_HTTP_TYPES = {401: "authentication_error", 404: "not_found_error", 405: INVALID, 413: INVALID}
_KEPT_HEADERS = ("Allow",)


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
