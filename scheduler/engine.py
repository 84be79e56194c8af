"""The async engine: one asyncio task owns the scheduler; the backend's step runs in a thread of its own so the
event loop keeps streaming while the model computes.

The engine supervises its own steps. A step that fails (the backend raises, returns an unusable output, or a
request's output cannot be processed) fails only the requests it touches, and the engine goes on. What it
cannot go on from, it declares: the engine *fails* when a step hangs past the watchdog, when too many steps
fail in a row, when a failure (with scheduler.debug_checks, any step) leaves the KV pool or the scheduler
inconsistent, or on a bug in the loop itself. Then every request still in flight ends with an error, nothing
more is admitted, and `wait_failed()` returns the cause, once, for the server to report and exit on.
"""

from __future__ import annotations

import asyncio
import logging
import time

from backends.base import Backend, StepOutput
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore, EngineStats
from scheduler.errors import ENGINE_FAILED, EngineStoppedError
from scheduler.guided import GuideFactory
from scheduler.output_processor import TokenizerLike
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from scheduler.step import SchedulerPlan
from scheduler.step_check import BadStepOutputError
from scheduler.step_cost import StepCostModel
from scheduler.step_runner import StepCrashedError, StepRunner, StepTimeoutError
from telemetry.interface import EngineObserver

log = logging.getLogger("pagedserve.engine")
SHUTDOWN_ERROR = "server shutting down"
MAX_CONSECUTIVE_FAILURES = 5  # failed steps in a row that mean the backend is broken, not unlucky


class EngineFailedError(Exception):
    """The engine cannot go on; the message is the cause."""


class Engine:
    def __init__(self, scheduler_config: SchedulerConfig, kv: KVCacheManager, backend: Backend,
                 tokenizer: TokenizerLike, *, max_model_len: int, observer: EngineObserver | None = None,
                 step_timeout_s: float = 0.0, max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES,
                 cost: StepCostModel | None = None, guides: GuideFactory | None = None) -> None:
        """step_timeout_s: the watchdog's limit on one step (0: none); cost: the step-cost model (a calibrated
        one; else one seeded with the backend's guess)."""
        self.core = EngineCore.for_backend(scheduler_config, kv, backend, tokenizer, max_model_len=max_model_len,
                                           observer=observer, cost=cost, guides=guides)
        self.backend = backend
        self._runner = StepRunner(backend.execute, inline=backend.step_is_instant, timeout_s=step_timeout_s)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._failures = _FailureCount(max_consecutive_failures)
        self._failed = asyncio.Event()
        self.failure: str | None = None  # why the engine failed, once it has

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
        self._runner.close()
        if self.core.guides is not None:
            self.core.guides.close()

    async def wait_failed(self) -> str:
        """Returns the cause once the engine has failed (never, while it is sound)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

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
        try:
            while not self._stopping:
                await self._next()
        except EngineFailedError as exc:
            self._fail_engine(str(exc), exc.__cause__)
        except Exception as exc:  # noqa: BLE001 - a bug in the loop itself: nothing it holds can be trusted
            self._fail_engine(f"the engine loop raised {type(exc).__name__}: {exc}", exc)

    async def _next(self) -> None:
        if not self.core.has_work:
            self._wake.clear()
            await self._wake.wait()
            return
        plan = self._plan()
        if plan.batch is not None:
            await self._step(plan)
        if self.core.config.debug_checks:
            self._check_consistency(f"engine step {plan.step_id}, checked with scheduler.debug_checks")
        # Let readers and new arrivals run between steps; when waiting work cannot be placed yet, let aborts in.
        await asyncio.sleep(0 if plan.batch is not None else 0.001)

    async def _step(self, plan: SchedulerPlan) -> None:
        started = self.core.clock()
        output = await self._execute(plan)
        if output is not None:
            self._commit(plan, output, started)

    def _plan(self) -> SchedulerPlan:
        try:
            return self.core.plan()
        except Exception as exc:
            raise EngineFailedError(f"planning a step raised {type(exc).__name__}: {exc}") from exc

    async def _execute(self, plan: SchedulerPlan) -> StepOutput | None:
        """The step's output, or None when it failed (its requests were failed)."""
        assert plan.batch is not None
        try:
            return await self._runner.run(plan.batch)
        except StepTimeoutError as exc:
            self.core.observer.step_failed("hang")
            raise EngineFailedError(str(exc)) from None
        except StepCrashedError as exc:
            self.core.observer.step_failed("crash")
            raise EngineFailedError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - a bug in the loop itself: nothing it holds can be trusted
            message = f"the model backend failed on this request's step: {type(exc).__name__}: {exc}"
            self._step_failed(plan, "backend_error", message, exc)
            return None

    def _commit(self, plan: SchedulerPlan, output: StepOutput, started: float) -> None:
        try:
            failed = self.core.commit(plan, output, started)
        except BadStepOutputError as exc:  # nothing was applied
            self._step_failed(plan, "bad_output", f"the model backend's output was unusable: {exc}", exc)
        except Exception as exc:  # noqa: BLE001 - a bug in the loop itself: nothing it holds can be trusted
            message = f"applying this request's step failed: {type(exc).__name__}: {exc}"
            self._step_failed(plan, "output_processing", message, exc)
            self._check_consistency(message)
        else:
            self._failures.record(bool(failed), "a request's output was unusable (see the log)")

    def _step_failed(self, plan: SchedulerPlan, cause: str, message: str, exc: BaseException) -> None:
        log.error("engine step %d failed (%s); failing its %d sequences: %s", plan.step_id, cause,
                  len(plan.seqs), message, exc_info=exc)
        try:
            self.core.fail(plan, message, cause)
        except Exception as inner:
            raise EngineFailedError(f"{message}; failing the step's requests then raised {inner!r}") from inner
        self._failures.record(True, message)

    def _check_consistency(self, message: str) -> None:
        try:
            self.core.check_consistency()
        except Exception as exc:
            raise EngineFailedError(f"{message}; it left the KV pool or the scheduler inconsistent: {exc}") from exc

    def _fail_engine(self, cause: str, exc: BaseException | None) -> None:
        """Once: log the cause, end every request in flight with an error, admit nothing more."""
        log.critical("the engine has failed and cannot serve any more: %s", cause, exc_info=exc)
        self.failure = cause
        self._stopping = True
        self.core.accepting = False
        self._runner.close()
        self.core.abort_all(f"the engine failed: {cause}", ENGINE_FAILED)
        self._failed.set()


class _FailureCount:
    """Failed steps in a row; too many mean the backend is broken."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0

    def record(self, failed: bool, message: str) -> None:
        self.in_a_row = self.in_a_row + 1 if failed else 0
        if self.limit and self.in_a_row >= self.limit:
            raise EngineFailedError(f"{self.in_a_row} engine steps in a row failed; the last: {message}")
