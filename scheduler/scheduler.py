"""The continuous-batching scheduler: pure and synchronous. `schedule()` returns a plan, the backend
executes it, `update()` applies the sampled tokens.

Token-centric: each step hands out a token budget, running sequences first (a decode token each, or the next
chunk of their prompt), then waiting ones, whose prompts are chunked to what is left of the budget. When a
running sequence needs a block and none is free, the tail of the running list (lowest priority, most recently
admitted) is preempted: its blocks go back and it waits at the front of the queue to be recomputed.

Why this always makes progress: nothing is placed ahead of the first running sequence (admissions and forks
join the tail; under the priority policy, only a request that outranks it), and it is preempted only if it
runs alone and still needs a block, which cannot happen: alone it has the whole pool, and no sequence grows
past that (it ends at `max_seq_len`; the engine refuses requests that could not fit). So it advances every
step and finishes, and the queue behind it moves up. Preemption costs only recompute; a sequence preempted
more than `max_preemptions` times fails instead (the pool is too small for the load), which bounds that cost.

A step's cost does not grow with Python objects per sequence: each running sequence owns a row of persistent
arrays (PersistentBatch: block table, token counts, sampling and stop parameters) patched only where something
changed, so planning is NumPy gathers over the rows plus one tight KV append loop, and update() appends the
tokens and leaves the stop checks to NumPy except for the few sequences that may have stopped.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from backends.base import LongArray, SamplingInputs, StepBatch, StepOutput
from backends.step_shape import StepShape
from kvpool import KVCacheManager
from scheduler.batch_builder import Samples, ScheduledSeq, StepColumns, StepWork, build_step_batch, lay_out
from scheduler.block_table import Index
from scheduler.config import SchedulerConfig
from scheduler.outputs import TokenLogprob
from scheduler.persistent_batch import PersistentBatch
from scheduler.prefill_time import PrefillTime
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step_cost import StepCostModel
from scheduler.stop import check_token_stop

AIM = 0.97  # of the ITL target, divided by the cost model's headroom: what prefill may fill a step up to


@dataclass(frozen=True)
class SampleState:
    """What update() needs of the plan besides its sampled sequences."""

    param_rows: LongArray  # persistent row whose parameters and stop conditions each sampled sequence uses
    num_tokens: LongArray  # each one's token count when planned
    forks: list[Sequence]  # parents whose pending choices fork once this step's token is in
    version: int  # the persistent rows' version when planned: unchanged at update means nothing was aborted


@dataclass(frozen=True)
class SchedulerPlan:
    step_id: int
    batch: StepBatch | None  # None when nothing could be scheduled
    seqs: list[Sequence] = field(default_factory=list)  # scheduled, in batch order
    starts: Index = field(default_factory=lambda: np.zeros(0, np.int32))  # first position each computes
    counts: Index = field(default_factory=lambda: np.zeros(0, np.int32))  # tokens each computes this step
    sampled: list[Sequence] = field(default_factory=list)  # one per row of batch.sample_rows
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)  # preempted once too often: ended, their requests fail
    admitted: list[Sequence] = field(default_factory=list)  # taken from the waiting queue this step
    prefill: tuple[int, ...] = ()  # indices into seqs of prompt chunks or recomputes (not one decode token)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    sample_state: SampleState | None = None
    shape: StepShape | None = None  # what the step does, for the cost model (None without one)
    predicted_s: float = 0.0  # the cost model's prediction of its time when planned

    @property
    def mixed(self) -> bool:
        """Prompt tokens beside decode tokens: the steps whose size an ITL target decides."""
        return self.prefill_tokens > 0 and self.decode_tokens > 0

    @cached_property
    def scheduled(self) -> list[ScheduledSeq]:
        """An object per scheduled sequence, built only for readers that want one."""
        items = zip(self.seqs, self.starts.tolist(), self.counts.tolist(), strict=True)
        return [ScheduledSeq(*item) for item in items]


@dataclass(frozen=True)
class StepUpdates:
    """A step's new tokens as columns: one per sampled sequence still running when the step ended."""

    seqs: list[Sequence]
    token_ids: list[int]
    finished: frozenset[int] = frozenset()  # positions of the sequences a token-level stop ended
    logprobs: list[TokenLogprob | None] | None = None  # per position, when the step returned logprobs


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                 eos_ids: frozenset[int], cost: StepCostModel | None = None) -> None:
        self.config = config
        self.kv = kv
        self.cost = cost  # predicts each step's time; with itl_target_ms, sizes prefill to fit the target
        # The longest a sequence may grow: the context, or the whole pool when that holds fewer tokens (a
        # sequence that outgrew the pool would preempt itself forever). Reaching it ends it with "length".
        self.max_seq_len = min(max_model_len, kv.max_sequence_tokens)
        self.eos_ids = eos_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.rows = PersistentBatch(eos_ids, self.max_seq_len)  # a row per running sequence
        self._by_priority = config.scheduling == "priority"
        self._step_id = 0
        self._batch_decoding = False  # static batching: the current batch has started decoding
        # (rows.version, the running list's seq ids, their rows), valid while the version is
        self._index: tuple[int, tuple[int, ...], LongArray] = (-1, (), np.zeros(0, np.int64))

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
        work = StepWork()
        evicted: list[Sequence] = []
        time = self._prefill_time()
        budget = self._schedule_running(self.config.max_num_batched_tokens, work, evicted, time)
        if not evicted and self._may_admit():
            self._admit(budget, work, time)
        copies = self.kv.take_block_copies()
        preempted, failed = _split_evicted(evicted) if evicted else (evicted, [])
        if not work.seqs:
            return SchedulerPlan(self._step_id, None, preempted=preempted, failed=failed)
        return self._plan(work, copies, preempted, failed)

    def _schedule_running(self, budget: int, work: StepWork, evicted: list[Sequence], time: PrefillTime | None
                          ) -> int:
        """Running sequences in order until the budget is spent: a decode token each, or a prompt chunk."""
        if not self.running:
            return budget
        ids, rows = self._running_index()
        lists = [s.token_ids for s in self.running]
        starts, num_tokens = self.rows.tokens.computed[rows], self.rows.tokens.known[rows]
        needs = num_tokens - starts
        if time is not None:
            needs = _timed_chunks(needs, starts, budget, time)
        counts = _budgeted(needs, budget)
        count_list = counts.tolist()
        k = self._append_running(ids, rows, lists, count_list, evicted)
        work.seqs, work.seq_ids, work.token_lists = self.running[:k], list(ids[:k]), lists[:k]
        work.running = StepColumns(rows[:k], starts[:k].astype(np.int32), counts[:k].astype(np.int32),
                                   num_tokens[:k])
        if time is not None and not counts[:k].all():  # prompts the target left out of this step
            _drop_idle(work)
        for seq, count in zip(work.seqs, work.running.counts.tolist(), strict=True):
            seq.num_computed_tokens += count  # the backend computes them before the next plan
        return budget - int(counts[:k].sum())

    def _append_running(self, ids: tuple[int, ...], rows: LongArray, lists: list[list[int]], counts: list[int],
                        evicted: list[Sequence]) -> int:
        """Slots for the running sequences' tokens; when blocks run out, the tail of the running list (perhaps
        the sequence itself) gives its blocks back. Returns how many stay scheduled."""
        k = len(counts)
        done, changes = self.kv.append(ids[:k], lists, counts)
        while done < k:
            victim = self.running[-1]
            self._evict(victim)
            evicted.append(victim)
            k = min(k, len(self.running))
            if done < k:
                done, more = self.kv.append(ids[:k], lists, counts, done)
                changes += more
        self.rows.patch_blocks(rows, changes)
        return k

    def _running_index(self) -> tuple[tuple[int, ...], LongArray]:
        """Seq ids and rows of the running list, rebuilt only when a row changed hands (the list did too)."""
        if self._index[0] != self.rows.version:
            index = self.rows.rows
            self._index = (self.rows.version, tuple(s.seq_id for s in self.running),
                           np.array([index[s.seq_id] for s in self.running], np.int64))
        return self._index[1], self._index[2]

    def _admit(self, budget: int, work: StepWork, time: PrefillTime | None) -> None:
        if not self.waiting:
            return
        # Choices still to fork hold their seats already, so forking never overfills a step.
        seats = len(self.running) + sum(len(s.children) for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            seats += 1 + len(seq.children)
            if seats > self.config.max_num_seqs:
                return
            cached = self.kv.num_cached_tokens(seq.token_ids)
            need = seq.num_tokens - cached
            count = min(need, budget) if time is None else time.chunk(need, cached, budget)
            if count == 0 or not self.kv.can_allocate(seq.token_ids, cached + count):
                return
            self._admit_one(self.waiting.popleft(), cached + count, work)
            budget -= count

    def _admit_one(self, seq: Sequence, num_tokens: int, work: StepWork) -> None:
        cached = self.kv.allocate(seq.seq_id, seq.token_ids, num_tokens)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = cached
        seq.num_computed_tokens = cached
        seq.status = SequenceStatus.RUNNING
        self._insert_running(seq)
        work.add(seq, self.rows.rows[seq.seq_id], seq.num_computed_tokens, num_tokens - seq.num_computed_tokens)
        seq.num_computed_tokens = num_tokens

    def _plan(self, work: StepWork, copies: list[tuple[int, int]], preempted: list[Sequence],
              failed: list[Sequence]) -> SchedulerPlan:
        cols = work.columns()
        self.rows.tokens.computed[cols.rows] = cols.starts + cols.counts
        layout = lay_out(work, cols, self.rows.tokens)
        samples = layout.samples
        param_rows = cols.rows[samples.batch_rows]
        batch = build_step_batch(self._step_id, work, cols, layout, self.rows.blocks, self.kv.block_size,
                                 self._sampling(samples, param_rows), copies)
        prefill_tokens = int(cols.counts[layout.prefill].sum())
        state = SampleState(param_rows, cols.num_tokens[samples.batch_rows], samples.forks, self.rows.version)
        shape = None if self.cost is None else StepShape.of(batch)
        return SchedulerPlan(self._step_id, batch, work.seqs, cols.starts, cols.counts, samples.seqs, preempted,
                             failed, work.admitted, tuple(layout.prefill.tolist()), prefill_tokens,
                             batch.num_tokens - prefill_tokens, state, shape,
                             0.0 if shape is None or self.cost is None else self.cost.predict(shape))

    def _sampling(self, samples: Samples, param_rows: Index) -> SamplingInputs | None:
        if not samples.seqs:
            return None
        return self.rows.sampling.inputs(param_rows, samples.seqs, samples.forked, self.eos_ids,
                                         self.rows.version, self.rows.seqs)

    def _may_admit(self) -> bool:
        return self.config.batching == "continuous" or not self._batch_decoding

    def _prefill_time(self) -> PrefillTime | None:
        """The target's time left for prefill after the decode part, when a target is set and someone decodes
        (with nobody decoding, prefill stalls no one and runs at the full token budget)."""
        if self.cost is None or self.config.itl_target_ms <= 0 or not self.running:
            return None
        _, rows = self._running_index()
        tokens = self.rows.tokens
        starts, known = tokens.computed[rows], tokens.known[rows]
        decoding = (known - starts == 1)
        if not (decoding & (known > tokens.prompt_lens[rows])).any():
            return None
        n, context = int(decoding.sum()), int((starts[decoding] + 1).sum())
        decode = self.cost.coefficients.seconds(StepShape(n, n, context, context))
        # The planner fills steps up to the limit, so a fit 1 % low would put most of them just over: aim under.
        limit = AIM * self.config.itl_target_ms / 1e3 / self.cost.headroom
        return PrefillTime(self.cost.coefficients, limit, decode, n, self.config.min_prefill_chunk)

    # --- applying a step's results ---------------------------------------------------------------
    def update(self, plan: SchedulerPlan, output: StepOutput) -> StepUpdates:
        """Append each sampled token, fork pending choices, and finish sequences that hit a stop."""
        state = plan.sample_state
        if state is None or not plan.sampled:
            return StepUpdates([], [])
        maybe_stopped = self.rows.stops.candidates(state.param_rows, output.token_ids, state.num_tokens + 1)
        intact = state.version == self.rows.version  # nothing was aborted while the step ran
        self._fork_children(state.forks)
        seqs, tokens, index = plan.sampled, output.token_ids.tolist(), None
        if not intact:
            index, seqs, tokens = _running_only(seqs, tokens)
            maybe_stopped = maybe_stopped[index]
        self._append_tokens(seqs, tokens, state, output.token_ids if index is None else output.token_ids[index])
        finished = self._finish_stopped(seqs, maybe_stopped)
        if seqs and self.config.batching == "static":
            self._batch_decoding = bool(self.running)
        return StepUpdates(seqs, tokens, finished, _logprobs(output, seqs, tokens, index))

    def _append_tokens(self, seqs: list[Sequence], tokens: list[int], state: SampleState, token_array: LongArray
                       ) -> None:
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids.append(token)
        if len(seqs) == len(state.param_rows) and not state.forks:  # each sampled from its own row
            rows = state.param_rows
        else:
            rows = np.array([self.rows.rows[seq.seq_id] for seq in seqs], np.int64)
        self.rows.tokens.appended(rows, token_array)

    def _finish_stopped(self, seqs: list[Sequence], maybe_stopped: np.ndarray) -> frozenset[int]:
        """check_token_stop decides, for the few sequences the NumPy pre-check could not rule out."""
        finished = []
        for i in np.flatnonzero(maybe_stopped).tolist():
            stop = check_token_stop(seqs[i], self.eos_ids, self.max_seq_len)
            if stop is not None:
                self.finish(seqs[i], stop.status, stop.stop_reason)
                finished.append(i)
        return frozenset(finished)

    def _fork_children(self, parents: list[Sequence]) -> None:
        for seq in parents:
            if seq.status is SequenceStatus.RUNNING and seq.children:
                for child in seq.children:
                    self.kv.fork(seq.seq_id, child.seq_id)
                    child.num_computed_tokens = seq.num_computed_tokens
                    child.status = SequenceStatus.RUNNING
                    self._insert_running(child)
                seq.children = []

    def check_rows(self) -> None:
        """The persistent rows mirror the running sequences and their block tables (for tests; O(rows))."""
        self.rows.check(self.running, {s.seq_id: self.kv.block_table(s.seq_id) for s in self.running})

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
        """Into the running list, and a row with the block table the KV manager just gave it."""
        if self._by_priority:
            keys = [s.sort_key(True) for s in self.running]
            self.running.insert(bisect.bisect(keys, seq.sort_key(True)), seq)
        else:
            self.running.append(seq)
        self.rows.add(seq, self.kv.block_table(seq.seq_id))

    def _evict(self, seq: Sequence) -> None:
        """Take the sequence's blocks back: it waits to be recomputed, or, preempted too often, it ends."""
        if seq.num_preemptions >= self.config.max_preemptions:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        else:
            self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.rows.remove(seq)
        self.kv.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self._enqueue(seq, front=True)

    def _remove(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.rows.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if self.kv.has_sequence(seq.seq_id):
            self.kv.free(seq.seq_id)


def _split_evicted(evicted: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """(preempted, failed): the evicted sequences still waiting, and those that ended."""
    return [s for s in evicted if not s.status.finished], [s for s in evicted if s.status.finished]


def _budgeted(needs: LongArray, budget: int) -> LongArray:
    """Tokens for each running sequence in order (all it has not computed), until the budget is spent; the
    last one served may get a partial chunk. Those after it get nothing and are left out."""
    if int(needs.sum()) <= budget:  # every one gets all it needs: the decode step
        return needs
    before = np.cumsum(needs) - needs  # budget handed out ahead of each
    served = int(np.count_nonzero(before < budget))
    return np.minimum(needs[:served], budget - before[:served])


def _timed_chunks(needs: LongArray, starts: LongArray, budget: int, time: PrefillTime) -> LongArray:
    """The running sequences' needs with each prompt chunk cut to the time left (decode tokens untouched); a
    prompt that gets none sits this step out (the first always gets its minimum chunk)."""
    prompts = np.flatnonzero(needs > 1)
    if prompts.size == 0:
        return needs
    needs = needs.copy()
    tokens_left = budget - int(np.count_nonzero(needs == 1))
    for i in prompts.tolist():
        needs[i] = time.chunk(int(needs[i]), int(starts[i]), tokens_left)
        tokens_left -= int(needs[i])
    return needs


def _drop_idle(work: StepWork) -> None:
    """Leave out of the step the running sequences given no tokens."""
    cols = work.running
    keep = np.flatnonzero(cols.counts > 0)
    index = keep.tolist()
    work.seqs = [work.seqs[i] for i in index]
    work.seq_ids = [work.seq_ids[i] for i in index]
    work.token_lists = [work.token_lists[i] for i in index]
    work.running = StepColumns(cols.rows[keep], cols.starts[keep], cols.counts[keep], cols.num_tokens[keep])


def _running_only(seqs: list[Sequence], tokens: list[int]) -> tuple[list[int], list[Sequence], list[int]]:
    """Drop the sequences aborted while the step ran: (their positions kept, sequences, tokens)."""
    index = [i for i, seq in enumerate(seqs) if seq.status is SequenceStatus.RUNNING]
    return index, [seqs[i] for i in index], [tokens[i] for i in index]


def _logprobs(output: StepOutput, seqs: list[Sequence], tokens: list[int], index: list[int] | None
              ) -> list[TokenLogprob | None] | None:
    if output.logprobs is None:
        return None
    rows = index if index is not None else range(len(seqs))
    return [_logprob(output, row, seq, token) for row, seq, token in zip(rows, seqs, tokens, strict=True)]


def _logprob(output: StepOutput, row: int, seq: Sequence, token: int) -> TokenLogprob | None:
    if not (seq.params.logprobs or seq.params.top_logprobs) or output.logprobs is None:
        return None
    top: tuple[tuple[int, float], ...] = ()
    if seq.params.top_logprobs and output.top_token_ids is not None and output.top_logprobs is not None:
        ids, values = output.top_token_ids[row], output.top_logprobs[row]
        top = tuple((int(i), float(v)) for i, v in list(zip(ids, values, strict=True))[: seq.params.top_logprobs])
    return TokenLogprob(token, float(output.logprobs[row]), top)
