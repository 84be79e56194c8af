"""The continuous-batching scheduler: pure and synchronous. `schedule()` returns a plan, the backend
executes it, `update()` applies the sampled tokens.

Token-centric: each step hands out a token budget, running sequences first (a decode token each, or the next
chunk of their prompt), then waiting ones, whose prompts are chunked to what is left of the budget. When a
running sequence needs a block and none is free, the tail of the running list (lowest priority, most recently
admitted) is preempted: its blocks go back and it waits at the front of the queue to be recomputed.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

from backends.base import StepBatch, StepOutput
from kvpool import KVCacheManager
from scheduler.batch_builder import ScheduledSeq, build_step_batch
from scheduler.config import SchedulerConfig
from scheduler.outputs import TokenLogprob
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.stop import check_token_stop


@dataclass(frozen=True)
class SchedulerPlan:
    step_id: int
    batch: StepBatch | None  # None when nothing could be scheduled
    scheduled: list[ScheduledSeq]
    sampled: list[Sequence]  # one per row of batch.sample_rows
    preempted: list[Sequence] = field(default_factory=list)

    @cached_property  # read once per request per step by the telemetry records: compute it once
    def prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.is_prefill)

    @cached_property
    def decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled) - self.prefill_tokens


@dataclass(frozen=True)
class SeqUpdate:
    seq: Sequence
    token_id: int
    logprob: TokenLogprob | None
    finished: bool


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                 eos_ids: frozenset[int]) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_ids = eos_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_priority = config.scheduling == "priority"
        self._step_id = 0
        self._batch_decoding = False  # static batching: the current batch has started decoding

    # --- requests in and out ---------------------------------------------------------------------
    def add(self, seqs: list[Sequence]) -> None:
        """A request's choices: seqs[0] is scheduled; the others fork from it once its prompt is in."""
        head, *rest = seqs
        for child in rest:
            child.status = SequenceStatus.FORK_PENDING
        head.children = list(rest)
        self._enqueue(head)

    def finish(self, seq: Sequence, status: SequenceStatus, stop_reason: str | int | None = None) -> None:
        """End a sequence (and any unforked choices it carries): blocks back to the pool."""
        for s in (seq, *seq.children):
            if s.status.finished:
                continue
            self._remove(s)
            s.status, s.stop_reason = status, stop_reason
        seq.children = []
        if not self.running:
            self._batch_decoding = False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting_tokens(self) -> int:
        return sum(s.num_tokens for s in self.waiting)

    # --- planning --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerPlan:
        self._step_id += 1
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted and self._may_admit():
            self._admit(budget, scheduled)
        copies = self.kv.take_block_copies()
        if not scheduled:
            return SchedulerPlan(self._step_id, None, [], [], preempted)
        batch, sampled = build_step_batch(self._step_id, scheduled, copies, self.eos_ids)
        return SchedulerPlan(self._step_id, batch, scheduled, sampled, preempted)

    def _schedule_running(self, budget: int, scheduled: list[ScheduledSeq], preempted: list[Sequence]) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            count = min(seq.num_uncomputed, budget)
            slots = self._append_or_preempt(seq, count, preempted)
            if slots is None:  # the sequence itself was the one to go
                break
            scheduled.append(self._scheduled(seq, count, slots))
            budget -= count
            i += 1
        return budget

    def _append_or_preempt(self, seq: Sequence, count: int, preempted: list[Sequence]) -> list[int] | None:
        while (slots := self.kv.append_slots(seq.seq_id, seq.token_ids, count)) is None:
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return None
        return slots

    def _admit(self, budget: int, scheduled: list[ScheduledSeq]) -> None:
        # Choices still to fork hold their seats already, so forking never overfills a step.
        seats = len(self.running) + sum(len(s.children) for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            seats += 1 + len(seq.children)
            if seats > self.config.max_num_seqs:
                return
            cached = self.kv.num_cached_tokens(seq.token_ids)
            count = min(seq.num_tokens - cached, budget)
            if not self.kv.can_allocate(seq.token_ids, cached + count):
                return
            self.waiting.popleft()
            allocation = self.kv.allocate(seq.seq_id, seq.token_ids, cached + count)
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = allocation.num_cached_tokens
            seq.num_computed_tokens = allocation.num_cached_tokens
            seq.status = SequenceStatus.RUNNING
            self._insert_running(seq)
            scheduled.append(self._scheduled(seq, count, allocation.slots))
            budget -= count

    def _scheduled(self, seq: Sequence, count: int, slots: list[int]) -> ScheduledSeq:
        start = seq.num_computed_tokens
        seq.num_computed_tokens += count  # the backend computes them before the next plan
        return ScheduledSeq(seq, start, count, slots, self.kv.block_table(seq.seq_id))

    def _may_admit(self) -> bool:
        return self.config.batching == "continuous" or not self._batch_decoding

    # --- applying a step's results ---------------------------------------------------------------
    def update(self, plan: SchedulerPlan, output: StepOutput) -> list[SeqUpdate]:
        """Append each sampled token, fork pending choices, and finish sequences that hit a stop."""
        self._fork_children(plan.sampled)
        updates = []
        for row, seq in enumerate(plan.sampled):
            if seq.status is not SequenceStatus.RUNNING:  # aborted while the step ran
                continue
            token = int(output.token_ids[row])
            seq.token_ids.append(token)
            stop = check_token_stop(seq, self.eos_ids, self.max_model_len)
            if stop is not None:
                self.finish(seq, stop.status, stop.stop_reason)
            updates.append(SeqUpdate(seq, token, _logprob(output, row, seq, token), stop is not None))
        if updates and self.config.batching == "static":
            self._batch_decoding = bool(self.running)
        return updates

    def _fork_children(self, sampled: list[Sequence]) -> None:
        for seq in sampled:
            if seq.status is SequenceStatus.RUNNING and seq.children:
                for child in seq.children:
                    self.kv.fork(seq.seq_id, child.seq_id)
                    child.num_computed_tokens = seq.num_computed_tokens
                    child.status = SequenceStatus.RUNNING
                    self._insert_running(child)
                seq.children = []

    # --- queues ----------------------------------------------------------------------------------
    def _enqueue(self, seq: Sequence, front: bool = False) -> None:
        seq.status = SequenceStatus.WAITING
        if self._by_priority:
            keys = [s.sort_key(True) for s in self.waiting]
            self.waiting.insert(bisect.bisect(keys, seq.sort_key(True)), seq)
        elif front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _insert_running(self, seq: Sequence) -> None:
        if self._by_priority:
            keys = [s.sort_key(True) for s in self.running]
            self.running.insert(bisect.bisect(keys, seq.sort_key(True)), seq)
        else:
            self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self._enqueue(seq, front=True)

    def _remove(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if self.kv.has_sequence(seq.seq_id):
            self.kv.free(seq.seq_id)


def _logprob(output: StepOutput, row: int, seq: Sequence, token: int) -> TokenLogprob | None:
    if not (seq.params.logprobs or seq.params.top_logprobs) or output.logprobs is None:
        return None
    top: tuple[tuple[int, float], ...] = ()
    if seq.params.top_logprobs and output.top_token_ids is not None and output.top_logprobs is not None:
        ids, values = output.top_token_ids[row], output.top_logprobs[row]
        top = tuple((int(i), float(v)) for i, v in list(zip(ids, values, strict=True))[: seq.params.top_logprobs])
    return TokenLogprob(token, float(output.logprobs[row]), top)
