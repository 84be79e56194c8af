"""What the live dashboard shows of the engine (service/dashboard): a view of every step as it ends, of the
engine going idle, and a snapshot of everything in flight for a viewer that just connected.

Views are built only while a `StepWatcher` says someone is watching: with nobody watching, a step costs one
attribute check. Every step's view carries what the step did (its rows, tokens and times), the pool's block
counts and who ended; the parts that cost O(blocks) or O(queue) to build (the block map, each request's blocks,
the waiting queue) come as a `Detail` at most every DETAIL_INTERVAL_S, which is as often as a page can show them,
and always in the idle view and the snapshot. Views are plain frozen data (the service encodes them as JSON);
times are Unix seconds, for a browser's clock, and durations milliseconds.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvpool import KVCacheManager
from scheduler.output_processor import RequestState
from scheduler.scheduler import Scheduler
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step import SchedulerPlan

log = logging.getLogger("pagedserve.engine")
QUEUE_SHOWN = 64  # waiting sequences listed by name; the rest are counted
DETAIL_INTERVAL_S = 0.1


class StepWatcher(Protocol):
    """Who receives the views (service/dashboard/feed.py)."""

    @property
    def watching(self) -> bool:
        """False while nobody watches: then no view is built."""
        ...

    def publish(self, event: str, view: object) -> None:
        """A view, as event "step" or "idle"; must not block."""
        ...


@dataclass(frozen=True, slots=True)
class KVCounts:
    """The pool's blocks, as /metrics counts them: free includes cached ones, used + free == total."""

    total: int
    used: int
    cached: int  # free, holding a prefix a prompt can reuse
    free: int

    @classmethod
    def of(cls, kv: KVCacheManager) -> KVCounts:
        stats = kv.stats()
        return cls(stats.num_blocks, stats.used_blocks, stats.cached_free_blocks, stats.free_blocks)


@dataclass(frozen=True, slots=True)
class QueueEntry:
    id: str
    prompt_tokens: int
    waited_ms: float
    preempted: bool


@dataclass(frozen=True, slots=True)
class Detail:
    """What costs O(blocks) or O(queue) to build."""

    map: str  # each block's state, one character per block id (kvpool's BlockPool.state_map)
    shared: int  # used blocks shared by more than one sequence
    tables: dict[str, list[int]]  # each running request's blocks (all its choices')
    queue: list[QueueEntry]  # the waiting queue in order, its first QUEUE_SHOWN
    queue_more: int  # waiting beyond those
    preempted: int  # waiting sequences that were preempted (they wait to be recomputed)


@dataclass(frozen=True, slots=True)
class Rows:
    """The step's batch in batch order, as columns (a step may hold hundreds of rows, every few milliseconds)."""

    id: list[str]
    choice: list[int]
    phase: str  # one character per row: "p" prefill (a prompt chunk or a recompute), "d" decode
    tokens: list[int]  # tokens each computed in the step
    context: list[int]  # each one's tokens with KV after the step


@dataclass(frozen=True, slots=True)
class FinishedView:
    id: str
    reason: str  # the finish reason ("stop", "length", "abort"), or "error"
    ttft_ms: float | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None


@dataclass(frozen=True, slots=True)
class LaneView:
    id: str
    state: str  # "queued", "prefill" or "decode"
    prompt_tokens: int
    completion_tokens: int
    arrival: float


@dataclass(frozen=True, slots=True)
class StepView:
    step: int
    start: float
    end: float
    duration_ms: float
    predicted_ms: float  # 0: no prediction
    itl_target_ms: float  # 0: no target
    prefill_tokens: int
    decode_tokens: int
    rows: Rows
    kv: KVCounts
    running: int
    waiting: int
    preempted_now: list[str]  # requests preempted while the step was planned
    finished: list[FinishedView]  # requests that ended since the last view
    detail: Detail | None  # None: unchanged for the page, until the next one


@dataclass(frozen=True, slots=True)
class IdleView:
    """The engine has no work left (or requests ended between steps): the state it rests in."""

    time: float
    step: int
    itl_target_ms: float
    kv: KVCounts
    running: int
    waiting: int
    finished: list[FinishedView]
    detail: Detail


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Everything in flight, for a viewer that just connected."""

    time: float
    step: int
    itl_target_ms: float
    block_size: int
    max_num_seqs: int
    kv: KVCounts
    requests: list[LaneView]
    running: int
    waiting: int
    detail: Detail


class EngineViews:
    """Builds the views from the engine's own state; collects the requests that end between two views."""

    def __init__(self, scheduler: Scheduler, kv: KVCacheManager, requests: Mapping[str, RequestState],
                 max_num_seqs: int) -> None:
        self.watcher: StepWatcher | None = None
        self._scheduler, self._kv, self._requests, self._max_num_seqs = scheduler, kv, requests, max_num_seqs
        self._ended: list[FinishedView] = []
        self._ended_ids: dict[str, str] = {}  # the shown ids of those, by engine id
        self._names: dict[str, str] = {}  # engine id -> shown id, of the requests in views since someone watched
        self._last_step = 0
        self._last_detail = 0.0  # monotonic time of the last view with a Detail
        self._unreported = False  # something changed since the last view with a Detail

    @property
    def watching(self) -> bool:
        return self.watcher is not None and self.watcher.watching

    def ended(self, state: RequestState) -> None:
        """A request ended; reported with the next view."""
        if self.watching:
            _guarded(self._ended_one, state)

    def _ended_one(self, state: RequestState) -> None:
        request = state.request
        ttft = None if state.first_token is None else (state.first_token - request.arrival_time) * 1e3
        self._ended_ids[request.request_id] = request.shown_id
        self._ended.append(FinishedView(request.shown_id, "error" if state.error else state.finish_reason, ttft,
                                        len(request.prompt_token_ids), state.completion_tokens, state.error))
        self._unreported = True

    def step(self, plan: SchedulerPlan, started: float, end: float) -> None:
        """A step ended (`started`, `end`: when it was planned and when its tokens were out, on the engine's
        clock): its view to the watcher, when someone watches."""
        self._last_step = plan.step_id
        if not self.watching:
            if self._names:  # nobody watches any more: the ends that would have taken names out go unseen
                self._names.clear()
            return
        _guarded(self._step_view, plan, started, end)

    def _step_view(self, plan: SchedulerPlan, started: float, end: float) -> None:
        assert self.watcher is not None
        now, scheduler = time.time(), self._scheduler
        detail = self._detail() if time.monotonic() - self._last_detail >= DETAIL_INTERVAL_S else None
        self.watcher.publish("step", StepView(
            plan.step_id, now - (end - started), now, (end - started) * 1e3, plan.predicted_s * 1e3,
            scheduler.itl_limit_s * 1e3, plan.prefill_tokens, plan.decode_tokens, self._rows(plan),
            KVCounts.of(self._kv), len(scheduler.running), len(scheduler.waiting),
            list(dict.fromkeys(self._name(seq.request_id) for seq in plan.preempted)), self._take_ended(), detail))
        self._unreported = detail is None  # the page's block map and queue are older than this step

    def idle(self) -> None:
        """The engine has run out of work: its resting state, once, if anything changed since the last view with a
        Detail (so a page at rest shows the block map and queue as they are)."""
        if self._unreported and self.watching:
            _guarded(self._idle_view)

    def _idle_view(self) -> None:
        assert self.watcher is not None
        scheduler = self._scheduler
        self.watcher.publish("idle", IdleView(
            time.time(), self._last_step, scheduler.itl_limit_s * 1e3, KVCounts.of(self._kv), len(scheduler.running),
            len(scheduler.waiting), self._take_ended(), self._detail()))
        self._unreported = False

    def snapshot(self) -> EngineSnapshot:
        scheduler = self._scheduler
        lanes = [self._lane(state) for state in self._requests.values()]
        return EngineSnapshot(time.time(), self._last_step, scheduler.itl_limit_s * 1e3, self._kv.block_size,
                              self._max_num_seqs, KVCounts.of(self._kv), lanes, len(scheduler.running),
                              len(scheduler.waiting), self._detail())

    def _take_ended(self) -> list[FinishedView]:
        ended, self._ended = self._ended, []
        for request_id in self._ended_ids:
            self._names.pop(request_id, None)
        self._ended_ids = {}
        return ended

    def _rows(self, plan: SchedulerPlan) -> Rows:
        names = self._names
        ids = [names.get(seq.request_id) or self._name(seq.request_id) for seq in plan.seqs]
        phase = bytearray(b"d" * len(ids))
        for i in plan.prefill:
            phase[i] = ord("p")
        return Rows(ids, [seq.index for seq in plan.seqs], phase.decode(), plan.counts.tolist(),
                    (plan.starts + plan.counts).tolist())

    def _detail(self) -> Detail:
        self._last_detail = time.monotonic()
        waiting, now = self._scheduler.waiting, time.monotonic()
        queue = [QueueEntry(self._name(seq.request_id), seq.prompt_len, (now - seq.arrival_time) * 1e3,
                            seq.num_preemptions > 0) for seq in itertools.islice(waiting, QUEUE_SHOWN)]
        states = self._kv.block_map()
        return Detail(states, states.count("s"), self._tables(), queue, len(waiting) - len(queue),
                      sum(1 for seq in waiting if seq.num_preemptions))

    def _tables(self) -> dict[str, list[int]]:
        tables: dict[str, list[int]] = {}
        for seq in self._scheduler.running:
            if self._kv.has_sequence(seq.seq_id):
                tables.setdefault(self._name(seq.request_id), []).extend(self._kv.block_table(seq.seq_id))
        return tables

    def _name(self, request_id: str) -> str:
        """The id the dashboard shows for an engine id, the one the request's response carries (kept: a step's
        rows look up every running request's)."""
        state = self._requests.get(request_id)
        shown = state.request.shown_id if state is not None else self._ended_ids.get(request_id, request_id)
        self._names[request_id] = shown
        return shown

    def _lane(self, state: RequestState) -> LaneView:
        request = state.request
        arrival = time.time() - (time.monotonic() - request.arrival_time)
        return LaneView(request.shown_id, _phase(state.seqs[0]), len(request.prompt_token_ids),
                        state.completion_tokens, arrival)


def _guarded(build: Callable[..., None], *args: Any) -> None:
    """A view that fails to build is logged and lost: the dashboard must never fail the step it watches."""
    try:
        build(*args)
    except Exception:  # any bug in a view: the engine goes on without it
        log.exception("building the dashboard's view failed; the engine goes on without it")


def _phase(seq: Sequence) -> str:
    """Queued (waiting, preempted, or a choice not forked yet); prefill while its KV is behind its tokens by more
    than the one token a decode step computes; else decode."""
    if seq.status is not SequenceStatus.RUNNING:
        return "queued"
    return "prefill" if seq.num_computed_tokens < seq.num_tokens - 1 else "decode"
