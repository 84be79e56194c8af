"""GET /v1/models, GET /health, GET /metrics and GET /openapi.json."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.generation.state import REGISTRY_KEY, STATE_KEY, Phase
from service.openai.errors import JSON_CONTENT, RETRY_AFTER_S
from service.openai.schemas.responses import Health, ModelCard, ModelList
from service.routes.common import json_response, served_model


async def list_models(request: web.Request) -> web.Response:
    return json_response(ModelList("list", [_card(request)]))


async def retrieve_model(request: web.Request) -> web.Response:
    served_model(request, request.match_info["model"])  # 404 for any other name
    return json_response(_card(request))


def _card(request: web.Request) -> ModelCard:
    state = request.app[STATE_KEY]
    max_len = state.runtime.engine.max_model_len if state.runtime is not None else None
    return ModelCard(state.model_name, "model", state.created, "pagedserve", max_len)


async def health(request: web.Request) -> web.Response:
    """Readiness. 200 only when serving: load balancers stop routing here while loading, draining, failed, or
    degraded (most recent steps failed, or a step is stalled; it answers 200 again once steps succeed)."""
    state = request.app[STATE_KEY]
    if state.phase is not Phase.READY or state.runtime is None:
        return _unavailable(Health(state.phase.value))
    reason = state.runtime.engine.degraded()
    if reason is not None:
        return _unavailable(Health("degraded", reason))
    return json_response(Health(state.phase.value))


async def liveness(request: web.Request) -> web.Response:
    """Liveness: 200 while the process can still serve (loading, serving, degraded or draining); 503 once the
    engine or the model load has failed, which the process exits on by itself: a lasting 503 means it did not."""
    phase = request.app[STATE_KEY].phase
    if phase in (Phase.UNHEALTHY, Phase.FAILED):
        return _unavailable(Health(phase.value))
    return json_response(Health(phase.value))


def _unavailable(body: Health) -> web.Response:
    return json_response(body, 503, {"Retry-After": str(RETRY_AFTER_S)})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])  # telemetry's metrics included: it registers there
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def openapi(spec: dict[str, Any]) -> Handler:
    """The handler of GET /openapi.json: the document (service/app/openapi.py, from the config alone), encoded
    once."""
    body = msgspec.json.encode(spec)

    async def document(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=JSON_CONTENT)

    return document

