"""The async engine: one asyncio task owns the scheduler; the backend's step runs in a worker thread so the
event loop keeps streaming while the model computes."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from backends.base import Backend, StepOutput
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore, EngineStats
from scheduler.errors import EngineStoppedError
from scheduler.output_processor import TokenizerLike
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from scheduler.scheduler import SchedulerPlan
from telemetry.interface import EngineObserver

log = logging.getLogger("pagedserve.engine")
SHUTDOWN_ERROR = "server shutting down"


class Engine:
    def __init__(self, scheduler_config: SchedulerConfig, kv: KVCacheManager, backend: Backend,
                 tokenizer: TokenizerLike, *, max_model_len: int, observer: EngineObserver | None = None) -> None:
        self.core = EngineCore.for_backend(scheduler_config, kv, backend, tokenizer, max_model_len=max_model_len,
                                           observer=observer)
        self.backend = backend
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedserve-step")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._inline = bool(getattr(backend, "step_is_instant", False))

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pagedserve-engine")

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop admitting now, let running requests finish for up to drain_timeout, abort the rest."""
        self.core.accepting = False
        deadline = time.monotonic() + drain_timeout
        while self.core.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self.core.abort_all(SHUTDOWN_ERROR)
        self._executor.shutdown(wait=True)

    @property
    def accepting(self) -> bool:
        return self.core.accepting and not self._stopping

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    # --- requests --------------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> RequestStream:
        if self._stopping:
            raise EngineStoppedError("the server is shutting down and admits no new requests")
        stream = self.core.add_request(request)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Safe at any time: the current step's result for it is dropped, its blocks are freed now."""
        self.core.abort(request_id)

    def stats(self) -> EngineStats:
        return self.core.stats()

    # --- the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.core.plan()
            if plan.batch is None:  # waiting work that cannot be placed yet: let aborts/arrivals in
                await asyncio.sleep(0.001)
                continue
            started = self.core.clock()
            try:
                output = await self._execute(loop, plan)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                self._fail(plan, exc)
                continue
            self.core.commit(plan, output, started)
            await asyncio.sleep(0)  # let readers and new arrivals run between steps

    async def _execute(self, loop: asyncio.AbstractEventLoop, plan: SchedulerPlan) -> StepOutput:
        assert plan.batch is not None
        if self._inline:  # an instant step: the thread hop would cost more than the step
            return self.backend.execute(plan.batch)
        return await loop.run_in_executor(self._executor, self.backend.execute, plan.batch)

    def _fail(self, plan: SchedulerPlan, exc: Exception) -> None:
        log.exception("engine step %d failed; failing its %d requests", plan.step_id, len(plan.seqs),
                      exc_info=exc)
        self.core.fail(plan, f"the model backend failed on this request's step: {type(exc).__name__}: {exc}")
