"""The engine's synchronous core: admission, planning and applying results. The async `Engine` and the
offline `LLM` both drive it: `plan()`, run the batch on the backend, `commit()`."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from backends.base import Backend, StepOutput
from backends.step_shape import CostCoefficients
from kvpool import KVCacheManager, KVStats
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.draft import DraftModel
from scheduler.engine_view import EngineViews
from scheduler.errors import (
    GRAMMAR_FAILED,
    KV_CACHE_EXHAUSTED,
    DuplicateRequestError,
    EngineStoppedError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
)
from scheduler.guided import GuideFactory
from scheduler.output_processor import (
    RequestState,
    TokenizerLike,
    apply_updates,
    close_aborted,
    new_request_state,
)
from scheduler.outputs import RequestStream
from scheduler.request import EngineRequest
from scheduler.scheduler import Scheduler
from scheduler.sequence import SequenceStatus
from scheduler.speculation import SpecCounters
from scheduler.step import SchedulerPlan, StepUpdates
from scheduler.step_check import out_of_vocabulary
from scheduler.step_cost import StepCostModel
from telemetry.interface import (
    EngineObserver,
    NullObserver,
    RequestRecord,
    StepRecord,
    StepTokens,
    observes_steps,
)

log = logging.getLogger("pagedserve.engine")


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_requests: int
    kv: KVStats
    kv_shared_blocks: int = 0  # used blocks shared by more than one sequence (an O(blocks) count: per scrape)
    speculation: SpecCounters | None = None  # speculative decoding's totals, when it is on


class EngineCore:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, tokenizer: TokenizerLike, *,
                 max_model_len: int, observer: EngineObserver | None = None,
                 clock: Callable[[], float] = time.monotonic, cost: StepCostModel | None = None,
                 guides: GuideFactory | None = None, speculative: SpeculativeConfig | None = None,
                 draft: DraftModel | None = None) -> None:
        self.config = config
        self.draft = draft  # the draft model (speculative_method "draft"), run by the engine before each plan
        self.guides = guides  # None: requests with a grammar are refused
        self.kv = kv
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.max_model_len = max_model_len
        self.cost = cost if cost is not None else StepCostModel(CostCoefficients())
        self.scheduler = Scheduler(config, kv, max_model_len, frozenset(tokenizer.eos_token_ids), self.cost,
                                   speculative, draft)
        self._planned_at = 0.0  # when the step being run was planned: its time runs from there to its tokens
        self.observer: EngineObserver = observer or NullObserver()
        self._observes_steps = observes_steps(self.observer)
        self._itl_limit_s = self.scheduler.itl_limit_s
        self.observer.itl_target(self._itl_limit_s)
        self.clock = clock
        self.requests: dict[str, RequestState] = {}
        self.views = EngineViews(self.scheduler, kv, self.requests, config.max_num_seqs)  # the live dashboard's
        self.accepting = True
        self._seq_ids = itertools.count()

    @classmethod
    def for_backend(cls, config: SchedulerConfig, kv: KVCacheManager, backend: Backend, tokenizer: TokenizerLike,
                    *, max_model_len: int, observer: EngineObserver | None = None,
                    cost: StepCostModel | None = None, guides: GuideFactory | None = None,
                    speculative: SpeculativeConfig | None = None, draft: DraftModel | None = None) -> EngineCore:
        """A core whose clock is the backend's when it has one (the simulator's virtual clock), else monotonic;
        its step-cost model `cost`, else one seeded with the backend's guess (cost_prior())."""
        clock = backend.clock
        return cls(config, kv, tokenizer, max_model_len=max_model_len, observer=observer,
                   clock=clock.now if clock is not None else time.monotonic,
                   cost=cost if cost is not None else StepCostModel(backend.cost_prior()), guides=guides,
                   speculative=speculative, draft=draft)

    # --- admission -------------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> RequestStream:
        self._check_admissible(request)
        state = new_request_state(request, next(self._seq_ids), self.tokenizer, self.guides)
        for _ in range(request.params.n - 1):
            next(self._seq_ids)
        self.requests[request.request_id] = state
        self.scheduler.add(list(state.seqs))
        self.observer.request_queued(request.request_id, self.clock(), len(request.prompt_token_ids),
                                     request.params, request.trace_context)
        return state.stream

    def _check_admissible(self, request: EngineRequest) -> None:
        if not self.accepting:
            raise EngineStoppedError("the server is shutting down and admits no new requests")
        if request.request_id in self.requests:
            raise DuplicateRequestError(f"request id {request.request_id!r} is already in flight", "request_id")
        if request.params.n > self.config.max_num_seqs:
            raise InvalidRequestError(f"n={request.params.n} exceeds this server's max_num_seqs "
                                      f"({self.config.max_num_seqs})", "n")
        self._check_length(request)
        self._check_queue(len(request.prompt_token_ids))

    def _check_length(self, request: EngineRequest) -> None:
        prompt_len = len(request.prompt_token_ids)
        if prompt_len == 0:
            raise PromptTooLongError("the prompt is empty", "prompt")
        if prompt_len >= self.max_model_len:
            raise PromptTooLongError(
                f"this model's maximum context length is {self.max_model_len} tokens, but the prompt has "
                f"{prompt_len} tokens (at least one must be left to generate)", "prompt")
        self._check_kv_capacity(prompt_len, request.params.max_tokens)

    def _check_kv_capacity(self, prompt_len: int, max_tokens: int | None) -> None:
        """The prompt plus max_tokens must fit what the KV cache holds for one sequence, which no wait
        enlarges: such a request would be preempted forever. Without max_tokens the scheduler ends the
        sequence there instead. (max_tokens past the context is the service's check; here the context only
        ends a sequence.)"""
        capacity = self.kv.max_sequence_tokens
        if prompt_len >= capacity:
            raise PromptTooLongError(
                f"this server's KV cache holds at most {capacity} tokens for one sequence, but the prompt has "
                f"{prompt_len} tokens (at least one must be left to generate)", "prompt")
        if max_tokens is not None and prompt_len + max_tokens > capacity:
            raise PromptTooLongError(
                f"this server's KV cache holds at most {capacity} tokens for one sequence, but the request needs "
                f"{prompt_len + max_tokens} ({prompt_len} in the prompt, {max_tokens} for the completion); "
                "reduce the prompt or max_tokens", "max_tokens")

    def _check_queue(self, prompt_len: int) -> None:
        waiting = len(self.scheduler.waiting)
        if waiting >= self.config.max_waiting_requests or \
                self.scheduler.num_waiting_tokens + prompt_len > self.config.max_waiting_tokens:
            self.observer.request_rejected("queue_full")
            raise QueueFullError(f"the server is at capacity ({waiting} requests waiting); retry shortly",
                                 retry_after=1.0)

    def abort(self, request_id: str, error: str | None = None, code: str | None = None) -> None:
        """End a request: every choice finishes as aborted, the stream ends (with the error, if one)."""
        state = self.requests.get(request_id)
        if state is None:
            return
        for seq in state.seqs:
            self.scheduler.finish(seq, SequenceStatus.FINISHED_ABORTED)
        self._close(state, error, code)

    def abort_all(self, error: str, code: str | None = None) -> None:
        for request_id in list(self.requests):
            try:
                self.abort(request_id, error, code)
            except Exception:  # noqa: BLE001 - a broken state (the engine is failing): end the stream at least
                state = self.requests.pop(request_id, None)
                if state is not None:
                    state.stream.finish(error, code)

    # --- stepping --------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def plan(self) -> SchedulerPlan:
        self._planned_at = self.clock()
        plan = self.scheduler.schedule()
        now = self.clock()
        if self.scheduler.itl_limit_s != self._itl_limit_s:  # "auto" moved the limit in force
            self._itl_limit_s = self.scheduler.itl_limit_s
            self.observer.itl_target(self._itl_limit_s)
        for seq in plan.preempted:
            self.observer.request_preempted(seq.request_id, now)
        for seq in plan.admitted:  # the only way into a batch: a first schedule is an admission
            state = self.requests[seq.request_id]
            if state.first_scheduled is None:
                state.first_scheduled = now
        for seq in plan.failed:  # the whole request fails: its other choices' rows in this step are dropped
            self.abort(seq.request_id, self._preemption_error(), KV_CACHE_EXHAUSTED)
        return plan

    def _preemption_error(self) -> str:
        limit = self.config.max_preemptions
        return (f"the KV cache is too small for the current load: this request was preempted (its KV cache given "
                f"to others) more than the limit of {limit} times; retry later")

    def commit(self, plan: SchedulerPlan, output: StepOutput, started: float) -> list[str]:
        """Apply a finished step: the backend's tokens checked, the scheduler's update, then its outputs.
        Returns the requests it failed (a token id outside the vocabulary, an output that could not be
        processed); raises BadStepOutputError, changing nothing, when the output is unusable as a whole."""
        failed = self._fail_out_of_vocabulary(plan, output)
        return failed + self.process_outputs(plan, self.scheduler.update(plan, output), started)

    def _fail_out_of_vocabulary(self, plan: SchedulerPlan, output: StepOutput) -> list[str]:
        first_bad: dict[str, int] = {}
        for row, token in out_of_vocabulary(output, len(plan.sampled), self.vocab_size):
            first_bad.setdefault(plan.sampled[row].request_id, token)
        for request_id, token in first_bad.items():
            log.error("request %s: the backend returned token id %d, outside the vocabulary", request_id, token)
            self.abort(request_id, f"the model backend returned token id {token}, outside the vocabulary "
                                   f"({self.vocab_size} tokens)")
        if first_bad:
            self.observer.step_failed("bad_output")
        return list(first_bad)

    def process_outputs(self, plan: SchedulerPlan, updates: StepUpdates, started: float) -> list[str]:
        """Tokens into streams (text, stop strings), readers woken, telemetry told, finished requests closed.
        Returns the requests whose output could not be processed, which are failed."""
        end = self.clock()
        touched, ending, broken = apply_updates(self.requests, updates, self.scheduler)
        counts, firsts = self._publish(touched, end)
        seconds = end - self._planned_at
        if plan.shape is not None:
            self.cost.observe(plan.shape, seconds, plan.predicted_s, plan.mixed)
        if self._observes_steps:
            tokens = StepTokens(plan.step_id, end, len(plan.seqs), plan.prefill_tokens, list(touched), counts,
                                firsts)
            self.observer.step_finished(self._step_record(plan, started, end, seconds), tokens)
        for state in ending.values():
            if state.finished:
                self._close(state, None)
        for request_id, exc in broken.items():
            log.error("request %s: processing its output failed", request_id, exc_info=exc)
            self.abort(request_id, f"processing this request's output failed: {type(exc).__name__}: {exc}")
        for request_id, why in updates.broken_guides.items():
            log.warning("request %s: its grammar failed: %s", request_id, why)
            self.abort(request_id, f"the output could not follow its grammar: {why}", GRAMMAR_FAILED)
        if broken:
            self.observer.step_failed("output_processing")
        self.views.step(plan, self._planned_at, end)
        return list(broken)

    def _publish(self, touched: dict[str, RequestState], end: float) -> tuple[list[int], frozenset[str]]:
        """Wake each reader once per step; returns each request's token count and those that got their first."""
        counts: list[int] = []
        firsts: list[str] = []
        for request_id, state in touched.items():
            state.completion_tokens += state.step_tokens
            state.stream.publish(state.completion_tokens, state.cached_tokens)
            counts.append(state.step_tokens)
            state.step_tokens = 0
            if state.first_token is None:
                state.first_token = end
                firsts.append(request_id)
        return counts, frozenset(firsts)

    def fail(self, plan: SchedulerPlan, error: str, cause: str = "backend_error") -> None:
        """The step failed as a whole (cause: telemetry's STEP_FAILURE_CAUSES): fail only the requests it
        carried."""
        self.fail_requests(dict.fromkeys(seq.request_id for seq in plan.seqs), error, cause)

    def fail_requests(self, request_ids: Iterable[str], error: str, cause: str = "backend_error") -> None:
        """Some of a step's requests failed (the whole step, or those a re-run could not clear)."""
        for request_id in request_ids:
            self.abort(request_id, error)
        # Blocks were published in the prefix cache when planned, but this step may not have written their KV: a
        # later prompt must not hit them. Failures are rare, so forgetting the whole cache is the simple safe way.
        self.kv.reset_prefix_cache()
        self.observer.step_failed(cause)

    def check_consistency(self) -> None:
        """Raises KVInvariantError or RowMismatchError when the KV pool or the scheduler's rows are inconsistent
        (O(blocks + rows)): after a step that failed part-way, and after every step with debug_checks."""
        self.kv.check_invariants()
        self.scheduler.check_rows()
        if self.draft is not None:
            self.draft.check_invariants()

    def _close(self, state: RequestState, error: str | None, code: str | None = None) -> None:
        self.requests.pop(state.request.request_id, None)
        state.error = error
        close_aborted(state, error, code)
        self.views.ended(state)
        self.observer.request_finished(RequestRecord(
            state.request.request_id, state.request.arrival_time, self.clock(), state.finish_reason,
            len(state.request.prompt_token_ids), state.completion_tokens, state.cached_tokens,
            state.first_scheduled, state.first_token, error, tuple(seq.token_ids for seq in state.seqs)))

    def _step_record(self, plan: SchedulerPlan, started: float, end: float, seconds: float) -> StepRecord:
        kv = self.kv.stats()
        chunks = tuple((plan.seqs[i].request_id, int(plan.counts[i])) for i in plan.prefill)
        return StepRecord(plan.step_id, started, end, len(plan.seqs), plan.prefill_tokens,
                          plan.decode_tokens, kv.usage, len(self.scheduler.running),
                          len(self.scheduler.waiting), len(plan.preempted),
                          tuple(dict.fromkeys(seq.request_id for seq in plan.seqs)),
                          kv.prefix_queries, kv.prefix_hits, chunks, seconds, plan.predicted_s,
                          self.cost.named_coefficients, self.cost.headroom, plan.guessed_tokens)

    def stats(self) -> EngineStats:
        speculator = self.scheduler.speculator
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), len(self.requests),
                           self.kv.stats(), self.kv.block_map().count("s"),
                           None if speculator is None else replace(speculator.counters))
