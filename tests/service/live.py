"""A real server on an ephemeral loopback port, its event loop in a background thread, so tests can drive
it with ordinary (synchronous) clients and still reach into the engine."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from aiohttp import web
from openai import OpenAI

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.app.server import build_runtime, create_app, start_site
from service.config.settings import AppConfig, ServiceConfig
from service.generation.state import STATE_KEY, EngineLike, Phase, RuntimeBuilder, ServerState
from tests.service.rawhttp import request

T = TypeVar("T")
# The KV pool's block counts as /metrics names them (service/app/metrics.py): free includes cached, used shared.
KV_BLOCK_SERIES = {"used": 'pagedserve:kv_cache_blocks{state="used"}',
                   "free": 'pagedserve:kv_cache_blocks{state="free"}',
                   "cached": "pagedserve:kv_cache_blocks_cached", "shared": "pagedserve:kv_cache_blocks_shared"}


def sim_config(service: ServiceConfig | None = None, profile: str = "zero", **scheduler: Any) -> AppConfig:
    return AppConfig(service or ServiceConfig(port=0), BackendConfig(name="sim", sim_profile=profile),
                     SchedulerConfig(**scheduler), KVPoolConfig(num_blocks=512))


@contextlib.contextmanager
def numpy_client(files: ModelFiles, max_model_len: int, num_blocks: int, timeout: float = 120.0) -> Iterator[OpenAI]:
    """An official client of a real-model server (numpy backend) on loopback, closed afterwards."""
    config = AppConfig(ServiceConfig(port=0), BackendConfig(name="numpy"), SchedulerConfig(max_model_len=max_model_len),
                       KVPoolConfig(num_blocks=num_blocks))
    server = LiveServer.start(config, cached_builder(files), timeout=120)
    try:
        yield OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
    finally:
        server.close()


def cached_builder(files: ModelFiles) -> RuntimeBuilder:
    """The real builder, minus re-reading the tokenizer for every test server."""
    return functools.partial(build_runtime, files=files)


class LiveServer:
    def __init__(self, app: web.Application, port: int = 0) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.runner, self.url = self.run(start_site(app, "127.0.0.1", port))

    @classmethod
    def start(cls, config: AppConfig, build: RuntimeBuilder, timeout: float = 60.0, port: int = 0) -> LiveServer:
        """port: 0 for any free one; a restarted server takes its predecessor's."""
        server = cls(create_app(config, build), port)
        server.run(server.state.settled.wait(), timeout)
        assert server.state.phase is Phase.READY, server.state.failure
        return server

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the server's loop (the engine is not thread-safe)."""
        async def wrapped() -> T:
            return fn()
        return self.run(wrapped())

    @property
    def state(self) -> ServerState:
        return self.app[STATE_KEY]

    @property
    def engine(self) -> EngineLike:
        assert self.state.runtime is not None
        return self.state.runtime.engine

    def stats(self) -> Any:
        return self.call(self.engine.stats)

    def metrics(self) -> dict[str, float]:
        """Every series GET /metrics serves now, by its name and labels as written there."""
        lines = request("GET", self.url + "/metrics").body.decode().splitlines()
        return {name: float(value) for name, _, value in (line.rpartition(" ") for line in lines)
                if name and not name.startswith("#")}

    def kv_blocks(self) -> dict[str, int]:
        """The KV pool's block counts as /metrics reports them: used, free, cached, shared."""
        series = self.metrics()
        return {state: int(series[name]) for state, name in KV_BLOCK_SERIES.items()}

    def close(self) -> None:
        self.run(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
