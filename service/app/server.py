"""`pagedserve serve`: the server from the command line to listening, and back to drained. In order:

1. `main`: the command's flags, one per setting, compose the AppConfig with the config file and the
   PAGEDSERVE_* variables (service/config/command.py, service/config/settings.py).
2. `_run`: what can fail before the port is taken fails here, as one line and exit 2: the API key file, the
   model file (its header and tokenizer only), the backend's name. Then the log, and the event loop (uvloop).
3. `serve`: the app (`create_app`: state, metrics, middlewares, routes) listens on the port, on connections
   guarded by service/http/protocol.py, and says "pagedserve listening on URL".
4. Meanwhile, in the background, `_load` builds the runtime (`build_runtime`: model weights, backend, KV pool,
   step-cost calibration in service/app/assemble.py, then telemetry and the engine) and starts the engine; until
   then the API and /health answer 503. The runtime and the phase live in the app's state (service/generation/state.py).
5. On SIGTERM/SIGINT: stop admitting (new requests and /health get 503), let in-flight requests finish for up
   to the drain timeout, abort the rest (their streams get a final error event), close the listener, exit 0.
   A second signal skips what is left of the drain.

A model that fails to load ends the server with EXIT_LOAD_FAILED. If the engine fails while serving (it has
ended every request in flight with an error and logged why), the server answers 503 for FAILED_LINGER_S more
(/health included, so a prober sees why), lets handlers write their last errors, then exits with
EXIT_ENGINE_FAILED for a supervisor (compose, Kubernetes) to restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence

import uvloop
from aiohttp import web

from backends.model.loader import ModelFiles, open_model
from backends.registry import check_backend
from scheduler.guided import GuideFactory
from service.app.assemble import backend_info, build_engine, build_parts, calibrated_cost, model_name, model_names
from service.app.metrics import create_registry
from service.app.openapi import openapi_document
from service.app.own_thread import run_in_own_thread
from service.config.command import ConfigCommand, config_from, setup_logging
from service.config.settings import AppConfig, telemetry_config
from service.dashboard.feed import DashboardFeed
from service.dashboard.routes import FEED_KEY, add_dashboard
from service.generation.state import (
    CONFIG_KEY,
    ENCODER_KEY,
    REGISTRY_KEY,
    STATE_KEY,
    Phase,
    Runtime,
    RuntimeBuilder,
    ServerState,
)
from service.generation.tokenize import PromptEncoder
from service.http.auth import load_keys
from service.http.ids import add_header, add_traceresponse, request_id_middleware
from service.http.middleware import (
    auth_middleware,
    cors_headers,
    cors_middleware,
    counting_middleware,
    error_middleware,
    screening_middleware,
)
from service.http.protocol import make_runner
from service.openai.chat_bounds import measure
from service.routes.completions import create_chat_completion, create_completion
from service.routes.system import health, list_models, liveness, metrics, openapi, retrieve_model
from service.routes.tokens import detokenize, tokenize
from telemetry import Telemetry

log = logging.getLogger(__name__)
EXIT_LOAD_FAILED = 2
EXIT_ENGINE_FAILED = 3
FAILED_LINGER_S = 1.0


def main(argv: Sequence[str], prog: str, description: str) -> int:
    return ConfigCommand(_run).main(argv, prog, description)  # every flag of serve is a setting


def _run(args: argparse.Namespace) -> int:
    config = config_from(args)
    load_keys(config.service)  # an unreadable key file fails here, before the port is taken
    # A missing, non-GGUF or unsupported model fails here too (one line, exit 2); the weights load later,
    # in the background, while /health answers 503.
    _, files = open_model(config.backend.model, config.backend.chat_template)
    check_backend(config.backend)  # an unknown backend, a CPU tier this CPU cannot run
    setup_logging(config.service.log_level)
    build = functools.partial(build_runtime, files=files)
    return uvloop.run(serve(config, build, announce=lambda line: print(line, file=sys.stderr, flush=True)))


async def serve(config: AppConfig, build: RuntimeBuilder | None = None,
                announce: Callable[[str], None] = print) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0), the model fails to load (EXIT_LOAD_FAILED) or the engine
    fails (EXIT_ENGINE_FAILED). `build` makes the runtime (default: build_runtime)."""
    app = create_app(config, build)
    runner, url = await start_site(app, config.service.host, config.service.port)
    state = app[STATE_KEY]
    announce(f"pagedserve listening on {url} (model {state.model_name}, backend {config.backend.name})")
    signals = _Signals()
    try:
        await _until_done(state, signals.first)
        if state.phase is Phase.FAILED:
            print(f"error: {state.failure}", file=sys.stderr)
            return EXIT_LOAD_FAILED
        if state.phase is not Phase.UNHEALTHY:
            await _drain(app, config.service.drain_timeout_s, signals.second)
            return 0
        print(f"error: the engine failed, exiting: {state.failure}", file=sys.stderr)
        await asyncio.sleep(FAILED_LINGER_S)
        return EXIT_ENGINE_FAILED
    finally:
        await runner.cleanup()
        signals.remove()


def create_app(config: AppConfig, build: RuntimeBuilder | None = None) -> web.Application:
    """The app: all its state under typed keys (service/generation/state.py); the runtime is built by its lifecycle."""
    state = ServerState(model_name(config), model_names(config))
    registry, requests = create_registry(state)
    app = web.Application(
        client_max_size=config.service.max_body_bytes,
        middlewares=[counting_middleware(requests), request_id_middleware(), error_middleware(),
                     screening_middleware(), cors_middleware(config.service.cors_allow_origins),
                     auth_middleware(load_keys(config.service))],
    )
    app.on_response_prepare.append(add_header)
    app.on_response_prepare.append(add_traceresponse)
    if config.service.cors_allow_origins:
        app.on_response_prepare.append(cors_headers(config.service.cors_allow_origins))
    app[CONFIG_KEY] = config
    app[STATE_KEY] = state
    app[REGISTRY_KEY] = registry
    app[ENCODER_KEY] = PromptEncoder(config.service.tokenizer_threads, config.service.tokenizer_queue)
    app.cleanup_ctx.append(_lifecycle(build or build_runtime))
    _add_routes(app)
    if config.service.dashboard:
        add_dashboard(app, DashboardFeed(registry))
    return app


def _add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/health/live", liveness)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi(openapi_document(app[CONFIG_KEY])))


def _lifecycle(build: RuntimeBuilder) -> Callable[[web.Application], AsyncIterator[None]]:
    """Loading runs in the background, so the port is open and /health answers 503 meanwhile."""
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


async def build_runtime(config: AppConfig, files: ModelFiles | None = None) -> Runtime:
    """The default RuntimeBuilder: load and calibrate off the event loop, then make the engine on it. `files`
    skips re-reading the model's header and tokenizer when the caller already has them."""
    parts = await asyncio.to_thread(build_parts, config, files)
    # not a pool thread: the backend steps it runs leave OpenMP threads behind while their thread lives
    cost = await run_in_own_thread(functools.partial(calibrated_cost, config, parts), "pagedserve-calibrate")
    telemetry = Telemetry(telemetry_config(config.telemetry, model_name(config), os.environ))
    guides = await asyncio.to_thread(GuideFactory, parts.files.tokenizer)
    engine = build_engine(config, parts, observer=telemetry, cost=cost, guides=guides)
    files = parts.files
    return Runtime(engine, files.tokenizer, files.chat_template, telemetry, guides,
                   measure(files.chat_template, files.tokenizer), backend_info(config, parts))


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0: any free port); return the runner and the bound base URL."""
    runner = make_runner(app, app[CONFIG_KEY].service)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


async def _until_done(state: ServerState, signalled: asyncio.Event) -> None:
    """Wait for the first signal, for the model failing to load, or for the engine failing."""
    waits = [asyncio.create_task(event.wait()) for event in (signalled, state.settled, state.broken)]
    await asyncio.wait(waits[:2], return_when=asyncio.FIRST_COMPLETED)
    if state.phase is not Phase.FAILED:  # loaded (or signalled first): wait for a signal or a failure
        await asyncio.wait([waits[0], waits[2]], return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()


async def _drain(app: web.Application, timeout: float, second: asyncio.Event) -> None:
    log.info("shutting down: draining in-flight requests for up to %g s", timeout)
    drain = asyncio.create_task(stop_engine(app, timeout))
    hurry = asyncio.create_task(second.wait())
    await asyncio.wait([drain, hurry], return_when=asyncio.FIRST_COMPLETED)
    hurry.cancel()
    if not drain.done():  # a second signal: abort the rest now
        log.info("second signal: aborting in-flight requests")
        drain.cancel()
        await stop_engine_now(app)


async def stop_engine(app: web.Application, drain_timeout: float) -> None:
    """Stop admitting at once (503), let in-flight requests run up to drain_timeout, abort the rest."""
    state = app[STATE_KEY]
    state.stop_watching()
    if FEED_KEY in app:  # the dashboard's streams end; a page reconnects to whatever serves next
        app[FEED_KEY].close()
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


async def stop_engine_now(app: web.Application) -> None:
    runtime = app[STATE_KEY].runtime
    if runtime is not None:
        await runtime.engine.stop(0.0)
    app[STATE_KEY].phase = Phase.STOPPED


class _Signals:
    """SIGTERM/SIGINT: the first starts the shutdown, the second hurries it."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)

    def _on_signal(self) -> None:
        (self.second if self.first.is_set() else self.first).set()

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
