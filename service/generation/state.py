"""What the app holds: the typed keys, the server's lifecycle phase and the loaded runtime."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from backends.model.chat_template import ChatTemplate
from backends.model.tokenizer import Tokenizer
from scheduler.core import EngineStats
from scheduler.engine_view import EngineSnapshot, StepWatcher
from scheduler.guided import GuideFactory
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from service.config.settings import AppConfig
from service.generation.pacing import ActiveStreams
from service.generation.tokenize import PromptEncoder
from service.openai.chat_bounds import PromptBound


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"  # the model did not load
    UNHEALTHY = "unhealthy"  # the engine failed while serving: the server drains and exits non-zero


class EngineLike(Protocol):
    """The part of the engine the service uses (a test double implements the same)."""

    @property
    def accepting(self) -> bool: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def failure(self) -> str | None:
        """Why the engine failed; None while it is sound."""
        ...

    async def start(self) -> None: ...

    async def stop(self, drain_timeout: float = 0.0) -> None: ...

    def submit(self, request: EngineRequest) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def wait_failed(self) -> str: ...

    def watch(self, watcher: StepWatcher | None) -> None: ...

    def snapshot(self) -> EngineSnapshot: ...

    def degraded(self) -> str | None:
        """Why recent steps say the engine is not serving well (mostly failing, or stalled); None while sound."""
        ...


@dataclass(frozen=True)
class Runtime:
    """Everything that exists once the model is loaded."""

    engine: EngineLike
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    telemetry: Any = None  # telemetry.Telemetry when traces/metrics are on: rendered at /metrics, shut down last
    guides: GuideFactory | None = None  # compiles requests' grammars; None: constrained decoding is refused
    prompt_bound: PromptBound = PromptBound()  # the chat template's length bound (service/openai/chat_bounds.py)
    # what runs the model: /metrics' backend_info labels (service/app/assemble.py)
    backend_info: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


RuntimeBuilder = Callable[[AppConfig], Awaitable[Runtime]]


class ServerState:
    """The lifecycle: loading -> ready -> draining -> stopped (or loading -> failed, or ready -> unhealthy)."""

    def __init__(self, model_name: str, aliases: tuple[str, ...] = ()) -> None:
        self.model_name = model_name  # reported in /v1/models and in responses
        self.model_names = frozenset((model_name, *aliases))  # accepted in a request's "model"
        self.created = int(time.time())
        self.phase = Phase.LOADING
        self.runtime: Runtime | None = None
        self.failure: str | None = None
        self.settled = asyncio.Event()  # set once loading succeeded or failed
        self.broken = asyncio.Event()  # set once the engine failed while serving
        self.streams = ActiveStreams()
        self._watch: asyncio.Task[None] | None = None

    def ready(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.phase = Phase.READY
        self.settled.set()
        self._watch = asyncio.get_running_loop().create_task(self._watch_engine(runtime.engine))

    async def _watch_engine(self, engine: EngineLike) -> None:
        self.unhealthy(await engine.wait_failed())

    def unhealthy(self, cause: str) -> None:
        """The engine failed (it has logged why): refuse everything from now on, health included."""
        self.failure = cause
        self.phase = Phase.UNHEALTHY
        self.broken.set()

    def stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def fail(self, message: str) -> None:
        self.failure = message
        self.phase = Phase.FAILED
        self.settled.set()


CONFIG_KEY = web.AppKey("config", AppConfig)
STATE_KEY = web.AppKey("state", ServerState)
REGISTRY_KEY = web.AppKey("metrics_registry", CollectorRegistry)
ENCODER_KEY = web.AppKey("prompt_encoder", PromptEncoder)
