"""The aiohttp application factory. All state lives on the app under typed keys; the engine is started by a
cleanup context (loading runs in the background so /health can answer 503 meanwhile)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from service.assemble import build_runtime, model_name
from service.auth import load_keys
from service.config import AppConfig
from service.metrics import create_registry
from service.middleware import auth_middleware, counting_middleware, error_middleware, screening_middleware
from service.routes.completions import create_chat_completion, create_completion
from service.routes.system import health, list_models, metrics, retrieve_model
from service.state import CONFIG_KEY, ENCODER_KEY, REGISTRY_KEY, STATE_KEY, Phase, RuntimeBuilder, ServerState
from service.tokenize import PromptEncoder

log = logging.getLogger(__name__)


def create_app(config: AppConfig, build: RuntimeBuilder = build_runtime) -> web.Application:
    state = ServerState(model_name(config))
    registry, requests = create_registry(state)
    app = web.Application(
        client_max_size=config.service.max_body_bytes,
        middlewares=[counting_middleware(requests), error_middleware(), screening_middleware(),
                     auth_middleware(load_keys(config.service))],
    )
    app[CONFIG_KEY] = config
    app[STATE_KEY] = state
    app[REGISTRY_KEY] = registry
    app[ENCODER_KEY] = PromptEncoder(config.service.tokenizer_threads)
    app.cleanup_ctx.append(_lifecycle(build))
    _add_routes(app)
    return app


def _add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)


def _lifecycle(build: RuntimeBuilder) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        loading = asyncio.create_task(_load(app, build))
        yield
        loading.cancel()
        await stop_engine(app, drain_timeout=0.0)
        app[ENCODER_KEY].close()

    return lifecycle


async def _load(app: web.Application, build: RuntimeBuilder) -> None:
    state = app[STATE_KEY]
    try:
        runtime = await build(app[CONFIG_KEY])
        await runtime.engine.start()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # reported once, as one line; serve exits with status 2
        log.debug("model load failed", exc_info=True)
        state.fail(str(exc) or type(exc).__name__)
        return
    if runtime.telemetry is not None:  # /metrics renders the app's registry alone
        app[REGISTRY_KEY].register(runtime.telemetry.metrics)
    state.ready(runtime)
    log.info("model %s ready", state.model_name)


async def stop_engine(app: web.Application, drain_timeout: float) -> None:
    """Stop admitting at once (503), let in-flight requests run up to drain_timeout, abort the rest."""
    state = app[STATE_KEY]
    state.stop_watching()
    if state.runtime is None or state.phase is Phase.STOPPED:
        state.phase = Phase.STOPPED if state.phase is not Phase.FAILED else state.phase
        return
    unhealthy = state.phase is Phase.UNHEALTHY  # stays the phase to the end: /health keeps saying why
    if not unhealthy:
        state.phase = Phase.DRAINING
    await state.runtime.engine.stop(drain_timeout)
    if state.runtime.telemetry is not None:  # flushes spans: bounded, and off the event loop
        await asyncio.to_thread(state.runtime.telemetry.shutdown)
    if not unhealthy:
        state.phase = Phase.STOPPED
