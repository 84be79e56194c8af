"""Run the app on a TCP port until SIGTERM/SIGINT, then shut down gracefully.

Shutdown: stop admitting (new requests and /health get 503), let in-flight requests finish for up to the
drain timeout, abort the rest (their streams get a final error event), close the listener, exit 0. A second
signal skips what is left of the drain.

If the engine fails while serving (it has ended every request in flight with an error and logged why), the
server answers 503 for FAILED_LINGER_S more (/health included, so a prober sees why), lets handlers write
their last errors, then exits with EXIT_ENGINE_FAILED for a supervisor (compose, Kubernetes) to restart it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from aiohttp import web

from service.app import create_app, stop_engine
from service.assemble import build_runtime
from service.config import AppConfig
from service.runner import make_runner
from service.state import CONFIG_KEY, STATE_KEY, Phase, RuntimeBuilder, ServerState

log = logging.getLogger(__name__)
EXIT_LOAD_FAILED = 2
EXIT_ENGINE_FAILED = 3
FAILED_LINGER_S = 1.0


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0: any free port); return the runner and the bound base URL."""
    runner = make_runner(app, app[CONFIG_KEY].service)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"


async def serve(config: AppConfig, build: RuntimeBuilder = build_runtime,
                announce: Callable[[str], None] = print) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0), the model fails to load (EXIT_LOAD_FAILED) or the engine
    fails (EXIT_ENGINE_FAILED)."""
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
