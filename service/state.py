"""What the app holds: the typed keys, the server's lifecycle phase and the loaded runtime."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from backends.model.chat_template import ChatTemplate
from backends.model.tokenizer import Tokenizer
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from service.config import AppConfig
from service.pacing import ActiveStreams


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class EngineLike(Protocol):
    """The part of the engine the service uses (a test double implements the same)."""

    @property
    def accepting(self) -> bool: ...

    @property
    def max_model_len(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, drain_timeout: float = 0.0) -> None: ...

    def submit(self, request: EngineRequest) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> Any: ...


@dataclass(frozen=True)
class Runtime:
    """Everything that exists once the model is loaded."""

    engine: EngineLike
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    telemetry: Any = None  # telemetry.Telemetry when traces/metrics are on: rendered at /metrics, shut down last


RuntimeBuilder = Callable[[AppConfig], Awaitable[Runtime]]


class ServerState:
    """The lifecycle: loading -> ready -> draining -> stopped (or loading -> failed)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.created = int(time.time())
        self.phase = Phase.LOADING
        self.runtime: Runtime | None = None
        self.failure: str | None = None
        self.settled = asyncio.Event()  # set once loading succeeded or failed
        self.streams = ActiveStreams()

    def ready(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.phase = Phase.READY
        self.settled.set()

    def fail(self, message: str) -> None:
        self.failure = message
        self.phase = Phase.FAILED
        self.settled.set()


CONFIG_KEY = web.AppKey("config", AppConfig)
STATE_KEY = web.AppKey("state", ServerState)
REGISTRY_KEY = web.AppKey("metrics_registry", CollectorRegistry)
