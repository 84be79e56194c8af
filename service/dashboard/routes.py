"""GET /dashboard and its two assets (open: the page holds no data), and GET /dashboard/events (behind the API
key, like /v1/*): the snapshot of everything in flight, then one record per engine step, as server-sent events.

A browser's EventSource cannot send an Authorization header, so the page reads the stream with fetch(); its key
comes from the URL's fragment (`/dashboard#key=...`), which never reaches a server or its logs."""

from __future__ import annotations

from importlib import resources

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from service.dashboard.feed import DashboardFeed, TooManyViewersError, sse
from service.generation.state import STATE_KEY, Runtime, ServerState
from service.http.auth import DASHBOARD_FEED
from service.openai.errors import APIError
from service.routes.common import runtime_of

FEED_KEY = web.AppKey("dashboard_feed", DashboardFeed)
ASSETS = {"dashboard.html": "text/html", "dashboard.js": "text/javascript", "dashboard.css": "text/css"}


def add_dashboard(app: web.Application, feed: DashboardFeed) -> None:
    app[FEED_KEY] = feed
    page = resources.files("service.dashboard") / "page"
    for name, content_type in ASSETS.items():
        path = "/dashboard" if name == "dashboard.html" else f"/dashboard/{name}"
        app.router.add_get(path, _asset((page / name).read_bytes(), content_type))
    app.router.add_get(DASHBOARD_FEED, events)
    app.on_shutdown.append(_close_feed)  # before the server waits for its handlers: the feeds end first


async def _close_feed(app: web.Application) -> None:
    app[FEED_KEY].close()


def _asset(body: bytes, content_type: str) -> Handler:
    async def asset(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type, charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    return asset


async def events(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE_KEY]
    runtime = runtime_of(request)  # 503 while loading, draining or failed: the page retries
    feed = request.app[FEED_KEY]
    try:
        viewer = feed.join()
    except TooManyViewersError as exc:
        raise APIError(429, str(exc), "rate_limit_exceeded", code="too_many_viewers",
                       headers={"Retry-After": "5"}) from None
    try:
        runtime.engine.watch(feed)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        hello = _hello(state, runtime)
        viewer.forget_pending()  # steps that ended while the headers went out: the snapshot is newer
        await response.write(hello)
        async for chunk in viewer.chunks():
            await response.write(chunk)
        return response
    finally:
        feed.leave(viewer)


def _hello(state: ServerState, runtime: Runtime) -> bytes:
    """The snapshot a viewer starts from, with what runs the model."""
    snapshot = msgspec.to_builtins(runtime.engine.snapshot())
    body = {"model": state.model_name, "backend": runtime.backend_info.get("backend", ""), **snapshot}
    return sse("hello", msgspec.json.encode(body))
