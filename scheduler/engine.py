"""The async engine: one asyncio task owns the scheduler; the backend's step runs in a thread of its own so the
event loop keeps streaming while the model computes.

The engine supervises its own steps. A step that fails (the backend raises, returns an unusable output, or a
request's output cannot be processed) fails only the requests it touches, and the engine goes on; when the
backend raised on a step of several requests, the step is re-run in parts to find the one that made it fail
(scheduler/step_retry.py), and only that one fails. How recent steps went is kept for /health (`health()`). What it
cannot go on from, it declares: the engine *fails* when a step hangs past the watchdog, when too many steps
fail in a row, when a failure (with scheduler.debug_checks, any step) leaves the KV pool or the scheduler
inconsistent, or on a bug in the loop itself. Then every request still in flight ends with an error, nothing
more is admitted, and `wait_failed()` returns the cause, once, for the server to report and exit on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from backends.base import Backend, StepBatch, StepOutput
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.core import EngineCore, EngineStats
from scheduler.draft import DraftModel
from scheduler.engine_view import EngineSnapshot, StepWatcher
from scheduler.errors import ENGINE_FAILED, EngineStoppedError
from scheduler.guided import GuideFactory
from scheduler.output_processor import TokenizerLike
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from scheduler.step import SchedulerPlan
from scheduler.step_check import BadStepOutputError, out_of_vocabulary
from scheduler.step_cost import StepCostModel
from scheduler.step_health import HealthLimits, StepHealth
from scheduler.step_retry import isolate, merged_output, units_of
from scheduler.step_runner import StepCrashedError, StepRunner, StepTimeoutError
from telemetry.interface import EngineObserver

log = logging.getLogger("pagedserve.engine")
T = TypeVar("T")
SHUTDOWN_ERROR = "server shutting down"
MAX_CONSECUTIVE_FAILURES = 5  # failed steps in a row that mean the backend is broken, not unlucky


class EngineFailedError(Exception):
    """The engine cannot go on; the message is the cause."""


class Engine:
    def __init__(self, scheduler_config: SchedulerConfig, kv: KVCacheManager, backend: Backend,
                 tokenizer: TokenizerLike, *, max_model_len: int, observer: EngineObserver | None = None,
                 step_timeout_s: float = 0.0, max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES,
                 cost: StepCostModel | None = None, guides: GuideFactory | None = None,
                 health: HealthLimits | None = None, speculative: SpeculativeConfig | None = None,
                 draft: DraftModel | None = None) -> None:
        """step_timeout_s: the watchdog's limit on one step (0: none); cost: the step-cost model (a calibrated
        one; else one seeded with the backend's guess); health: when /health calls the engine degraded;
        draft: the draft model of speculative_method "draft", run in the step thread before each plan."""
        self.core = EngineCore.for_backend(scheduler_config, kv, backend, tokenizer, max_model_len=max_model_len,
                                           observer=observer, cost=cost, guides=guides, speculative=speculative,
                                           draft=draft)
        self.backend = backend
        self._runner = StepRunner(backend.execute, inline=backend.step_is_instant, timeout_s=step_timeout_s)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._failures = _FailureCount(max_consecutive_failures)
        self._failed = asyncio.Event()
        self.failure: str | None = None  # why the engine failed, once it has
        self.draft_failure: str | None = None  # why the draft model was switched off, once it was
        self.health = StepHealth(health or HealthLimits())

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

    def watch(self, watcher: StepWatcher | None) -> None:
        """Hand every step's view to `watcher` while it says someone watches (the live dashboard); None: stop."""
        self.core.views.watcher = watcher

    def snapshot(self) -> EngineSnapshot:
        """Everything in flight now, for a viewer that just connected."""
        return self.core.views.snapshot()

    def degraded(self) -> str | None:
        """Why /health should send traffic elsewhere now (most recent steps failed, or one is stalled)."""
        return self.health.problem()

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
            self.core.views.idle()
            self._wake.clear()
            await self._wake.wait()
            return
        await self._draft()
        plan = self._plan()
        if plan.batch is not None:
            await self._step(plan)
        if self.core.config.debug_checks:
            self._check_consistency(f"engine step {plan.step_id}, checked with scheduler.debug_checks")
        # Let readers and new arrivals run between steps; when waiting work cannot be placed yet, let aborts in.
        await asyncio.sleep(0 if plan.batch is not None else 0.001)

    async def _step(self, plan: SchedulerPlan) -> None:
        assert plan.batch is not None
        started = self.core.clock()
        output: StepOutput | None
        passing = False
        try:
            output = await self._run_watched(self._execute(plan.batch), plan.predicted_s)
        except EngineFailedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the backend's failure: its requests fail, the engine goes on
            output, passing = await self._recover(plan, exc)
            plan = replace(plan, shape=None)  # its time is the failed step's and the re-runs': no cost sample
        if output is not None:
            self._commit(plan, output, started, passing)

    async def _draft(self) -> None:
        """The draft model's guesses for the step about to be planned, computed in the step thread. A draft that
        raises is switched off (the log says why): the engine serves on without guesses, as fast as before
        speculation; a hang or a crash there is the engine's, as a step's would be."""
        draft, speculator = self.core.draft, self.core.scheduler.speculator
        jobs = self.core.scheduler.draft_jobs() if draft is not None and self.draft_failure is None else []
        if draft is None or speculator is None or not jobs:
            return
        try:
            speculator.take_drafts(await self._run_watched(functools.partial(draft.propose, jobs), 0.0))
        except EngineFailedError:
            raise
        except Exception as exc:  # the draft's failure costs its guesses, never a request
            self.draft_failure = f"{type(exc).__name__}: {exc}"
            log.error("the draft model failed (%s); speculative decoding is off from now on", self.draft_failure,
                      exc_info=exc)

    def _execute(self, batch: StepBatch) -> Callable[[], StepOutput]:
        return functools.partial(self.backend.execute, batch)

    def _plan(self) -> SchedulerPlan:
        try:
            return self.core.plan()
        except Exception as exc:
            raise EngineFailedError(f"planning a step raised {type(exc).__name__}: {exc}") from exc

    async def _run_watched(self, work: Callable[[], T], predicted_s: float) -> T:
        """One backend call (a step, or other work in the step thread) under the watchdog, its time watched by
        /health; a hang or a crash fails the engine."""
        self.health.running(predicted_s)
        try:
            return await self._runner.call(work)
        except StepTimeoutError as exc:
            self.core.observer.step_failed("hang")
            raise EngineFailedError(str(exc)) from None
        except StepCrashedError as exc:
            self.core.observer.step_failed("crash")
            raise EngineFailedError(str(exc)) from exc
        finally:
            self.health.stopped()

    async def _recover(self, plan: SchedulerPlan, exc: Exception) -> tuple[StepOutput | None, bool]:
        """The output of the step's requests that a re-run in parts clears, the others failed (None: all
        failed); and whether the fault passed (every part succeeded: nobody's request caused it)."""
        assert plan.batch is not None
        message = f"the model backend failed on this request's step: {type(exc).__name__}: {exc}"
        retry_s = self.core.config.failed_step_retry_s
        units = units_of(plan.batch, [seq.request_id for seq in plan.seqs], self.core.kv.block_size)
        if len(units) < 2 or not retry_s:
            self._step_failed(plan, "backend_error", message, exc)
            return None, False
        log.warning("engine step %d failed (%s); re-running it in parts to find the request that made it fail",
                    plan.step_id, message)
        found = await isolate(self._run_part, plan.batch, units, self.core.kv.block_size,
                              time.monotonic() + retry_s)
        try:
            output = merged_output(plan.batch, found.parts) if found.recovered else None
        except ValueError as merge_error:  # parts that disagree (a backend's widths): trust none of them
            log.error("engine step %d: its parts' outputs do not merge: %s", plan.step_id, merge_error)
            output = None
        if output is None:
            self._step_failed(plan, "backend_error", message, exc)
            return None, False
        self._fail_parts(plan, found.failed, message)
        return output, not found.failed

    def _fail_parts(self, plan: SchedulerPlan, units: list[tuple[int, ...]], message: str) -> None:
        """The requests of the units a re-run could not clear fail; none: the fault passed (still counted)."""
        failed = dict.fromkeys(plan.seqs[row].request_id for unit in units for row in unit)
        if not failed:
            log.warning("engine step %d: every part succeeded when re-run (a passing fault)", plan.step_id)
            self.core.observer.step_failed("backend_error")
            return
        requests = len({seq.request_id for seq in plan.seqs})
        log.error("engine step %d: failing %d of its %d requests, whose part failed again (%s): %s", plan.step_id,
                  len(failed), requests, ", ".join(failed), message)
        self.core.fail_requests(failed, message)

    async def _run_part(self, batch: StepBatch) -> StepOutput | None:
        """A part of a failed step: its output, or None when it failed too (or returned an unusable one)."""
        try:
            output = await self._run_watched(self._execute(batch), 0.0)
            out_of_vocabulary(output, len(batch.sample_rows), self.core.vocab_size)  # the shape, checked here
            return output
        except EngineFailedError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed part is what the search looks for
            log.info("a part of failed step %d failed too: %s: %s", batch.step_id, type(exc).__name__, exc)
            return None

    def _commit(self, plan: SchedulerPlan, output: StepOutput, started: float, passing_fault: bool = False) -> None:
        """A passing fault counts as a failed step for /health (the backend failed, nobody's request made it)
        but not toward the failures in a row: the step's requests were served."""
        try:
            failed = self.core.commit(plan, output, started)
        except BadStepOutputError as exc:  # nothing was applied
            self._step_failed(plan, "bad_output", f"the model backend's output was unusable: {exc}", exc)
        except Exception as exc:  # noqa: BLE001 - a bug in the loop itself: nothing it holds can be trusted
            message = f"applying this request's step failed: {type(exc).__name__}: {exc}"
            self._step_failed(plan, "output_processing", message, exc)
            self._check_consistency(message)
        else:
            self._record(bool(failed), "a request's output was unusable (see the log)", bool(failed) or passing_fault)

    def _step_failed(self, plan: SchedulerPlan, cause: str, message: str, exc: BaseException) -> None:
        log.error("engine step %d failed (%s); failing its %d sequences: %s", plan.step_id, cause,
                  len(plan.seqs), message, exc_info=exc)
        try:
            self.core.fail(plan, message, cause)
        except Exception as inner:
            raise EngineFailedError(f"{message}; failing the step's requests then raised {inner!r}") from inner
        self._record(True, message)

    def _record(self, failed: bool, message: str, unhealthy: bool | None = None) -> None:
        """The step's outcome: for /health (`unhealthy`, default `failed`) and the failures in a row."""
        self.health.outcome(failed if unhealthy is None else unhealthy)
        self._failures.record(failed, message)

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
