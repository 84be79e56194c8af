"""Run the app on a TCP port until SIGTERM/SIGINT, then shut down gracefully.

Shutdown: stop admitting (new requests and /health get 503), let in-flight requests finish for up to the
drain timeout, abort the rest (their streams get a final error event), close the listener, exit 0. A second
signal skips what is left of the drain.
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
    """Serve until SIGTERM/SIGINT (exit status 0), or until the model fails to load (2)."""
    app = create_app(config, build)
    runner, url = await start_site(app, config.service.host, config.service.port)
    announce(f"pagedserve listening on {url} (model {app[STATE_KEY].model_name}, backend {config.backend.name})")
    signals = _Signals()
    try:
        if not await _until_signal(app[STATE_KEY], signals.first):
            print(f"error: {app[STATE_KEY].failure}", file=sys.stderr)
            return 2
        await _drain(app, config.service.drain_timeout_s, signals.second)
        return 0
    finally:
        await runner.cleanup()
        signals.remove()


async def _until_signal(state: ServerState, signalled: asyncio.Event) -> bool:
    """Wait for the first signal; False if the model failed to load before it came."""
    stop = asyncio.create_task(signalled.wait())
    settled = asyncio.create_task(state.settled.wait())
    await asyncio.wait([stop, settled], return_when=asyncio.FIRST_COMPLETED)
    settled.cancel()
    if state.phase is Phase.FAILED:
        stop.cancel()
        return False
    await stop
    return True


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
