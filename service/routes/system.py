"""GET /v1/models, GET /health, GET /metrics and GET /openapi.json."""

from __future__ import annotations

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.config import AppConfig
from service.errors import JSON_CONTENT, RETRY_AFTER_S
from service.openapi import openapi_document
from service.routes.common import json_response, served_model
from service.schemas.responses import Health, ModelCard, ModelList
from service.state import REGISTRY_KEY, STATE_KEY, Phase


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
    """200 only when serving: load balancers stop routing here while loading, draining or failed."""
    phase = request.app[STATE_KEY].phase
    if phase is Phase.READY:
        return json_response(Health(phase.value))
    return json_response(Health(phase.value), 503, {"Retry-After": str(RETRY_AFTER_S)})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])  # telemetry's metrics included: it registers there
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def openapi(config: AppConfig) -> Handler:
    """The handler of GET /openapi.json. The document depends on the config alone: built and encoded once."""
    body = msgspec.json.encode(openapi_document(config))

    async def document(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=JSON_CONTENT)

    return document

