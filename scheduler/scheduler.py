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
arrays (PersistentBatch: its computed-token count, which lives only there; its token count and last token; its
KV block table as the pool reported it; its sampling and stop parameters), so planning is NumPy gathers over
the rows plus one tight KV append loop, and update() appends the tokens and leaves the stop checks to NumPy
except for the few sequences that may have stopped.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from backends.base import IntArray, LongArray, StepOutput
from backends.step_shape import StepShape
from kvpool import KVCacheManager
from scheduler.batch_builder import BlockCopies, Drafts, build_batch
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.draft import DraftJob, DraftModel
from scheduler.guesses import Proposals, draft_jobs, drafts_of, propose, settle_guesses
from scheduler.guided import PendingMasks
from scheduler.itl_target import ItlTarget, resolve_itl_target
from scheduler.persistent_batch import PersistentBatch, kv_tables
from scheduler.prefill_time import PrefillTime
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.speculation import Speculator
from scheduler.step import SchedulerPlan, StepUpdates, joined, token_logprobs
from scheduler.step_cost import StepCostModel
from scheduler.stop import check_token_stop

log = logging.getLogger("pagedserve.engine")

AIM = 0.97  # of the ITL target, divided by the cost model's headroom: what prefill may fill a step up to
_Columns = tuple[LongArray, IntArray, IntArray]  # rows, starts and counts of scheduled sequences


def _no_columns() -> _Columns:
    return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)


@dataclass
class _Chosen:
    """The step's sequences as the scheduler picks them, in batch order: the running ones in bulk, as arrays,
    then the admitted ones one at a time."""

    seqs: list[Sequence] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    running: _Columns = field(default_factory=_no_columns)
    guesses: Drafts | None = None  # the running ones' guesses, when any guess
    admitted: list[Sequence] = field(default_factory=list)
    _added: list[tuple[int, int, int]] = field(default_factory=list)  # admitted: row, start, count

    def add(self, seq: Sequence, start: int, count: int) -> None:
        self.seqs.append(seq)
        self.seq_ids.append(seq.seq_id)
        self.admitted.append(seq)
        self._added.append((seq.row, start, count))

    def drafts(self) -> Drafts | None:
        """The guesses of every chosen sequence (admitted ones have none), when any guesses."""
        if self.guesses is None or not self.guesses.total:
            return None
        extra = len(self._added)
        return Drafts(np.concatenate((self.guesses.counts, np.zeros(extra, np.int32))),
                      self.guesses.tokens + [[] for _ in range(extra)])

    def columns(self) -> _Columns:
        if not self._added:
            return self.running
        rows, starts, counts = np.array(self._added, np.int64).T
        run_rows, run_starts, run_counts = self.running
        return (np.concatenate((run_rows, rows)), np.concatenate((run_starts, starts.astype(np.int32))),
                np.concatenate((run_counts, counts.astype(np.int32))))


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                 eos_ids: frozenset[int], cost: StepCostModel | None = None,
                 speculative: SpeculativeConfig | None = None, draft: DraftModel | None = None) -> None:
        """draft: the draft model, with speculative_method "draft" (its guesses come through draft_jobs)."""
        self.config = config
        # guesses each decoding sequence's next tokens, verified in the step (None: speculation off)
        self.speculator = _speculator(speculative, draft)
        self.kv = kv
        self.cost = cost  # predicts each step's time; with itl_target_ms, sizes prefill to fit the target
        # "auto" prices each step's own decode part with the current (refitted) model: the shape it sees most,
        # so the one it predicts best. Without a model there is nothing to hold steps to.
        self.itl_target = ItlTarget(0.0) if cost is None else resolve_itl_target(config, cost.coefficients,
                                                                                 max_model_len)
        self.itl_limit_s = self.itl_target.seconds  # the limit of the last step that prefilled beside decodes
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
            if self.speculator is not None:
                self.speculator.forget(s.seq_id)
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
        chosen = _Chosen()
        evicted: list[Sequence] = []
        proposals = self._propose()
        time = self._prefill_time(proposals)
        budget = self._schedule_running(self.config.max_num_batched_tokens, chosen, evicted, time, proposals)
        if not evicted and self._may_admit():
            self._admit(budget, chosen, time)
        copies = self.kv.take_block_copies(), self.kv.take_window_block_copies() if self.kv.window_blocks else None
        preempted, failed = _split_evicted(evicted) if evicted else (evicted, [])
        if not chosen.seqs:
            return SchedulerPlan(self._step_id, None, preempted=preempted, failed=failed)
        return self._plan(chosen, copies, preempted, failed)

    def _schedule_running(self, budget: int, chosen: _Chosen, evicted: list[Sequence], time: PrefillTime | None,
                          proposals: Proposals | None) -> int:
        """Running sequences in order until the budget is spent: a decode token each (and its guesses, in what
        the budget leaves), or a prompt chunk."""
        if not self.running:
            return budget
        ids, rows = self._running_index()
        starts = self.rows.computed[rows]
        needs = self.rows.num_tokens[rows] - starts
        if time is not None:
            needs = _timed_chunks(needs, starts, budget, time)
        guesses = None if proposals is None else proposals.fitted(budget - int(needs.sum()))
        counts = _budgeted(needs if guesses is None else needs + guesses, budget)
        k, counts = self._append_running(ids, rows, counts, evicted, None if guesses is None else needs)
        chosen.seqs, chosen.seq_ids = self.running[:k], list(ids[:k])
        chosen.running = rows[:k], starts[:k].astype(np.int32), counts[:k].astype(np.int32)
        if guesses is not None and proposals is not None:
            chosen.guesses = drafts_of(proposals, counts[:k] - needs[:k])
        if time is not None and not counts[:k].all():  # prompts the target left out of this step
            _drop_idle(chosen)
        return budget - int(counts[:k].sum())

    def _append_running(self, ids: tuple[int, ...], rows: LongArray, counts: LongArray, evicted: list[Sequence],
                        unguessed: LongArray | None) -> tuple[int, LongArray]:
        """Slots for the running sequences' tokens; when blocks run out, the sequences not yet served drop their
        guesses (`unguessed`: the counts without them), then the tail of the running list (perhaps the sequence
        itself) gives its blocks back. Returns how many stay scheduled, and the counts they got."""
        k = len(counts)
        lists = [s.token_ids for s in self.running]
        done, changes = self.kv.append(ids[:k], lists, counts.tolist())
        given_back: list[int] = []
        if done < k and unguessed is not None:
            given_back = self._give_back_guesses(ids, rows, counts[:done], unguessed[:done])
            counts = unguessed.copy()
            done, more = self.kv.append(ids[:k], lists, counts.tolist(), done)
            changes += more
        while done < k:
            victim = self.running[-1]
            self._evict(victim)
            evicted.append(victim)
            k = min(k, len(self.running))
            if done < k:
                done, more = self.kv.append(ids[:k], lists, counts.tolist(), done)
                changes += more
        self.rows.patch_blocks(rows, changes)
        for i in given_back:
            if i < k:  # its table shrank after the changes above were recorded
                self.rows.set_tables(int(rows[i]), *kv_tables(self.kv, ids[i]))
        return k, counts

    def _give_back_guesses(self, ids: tuple[int, ...], rows: LongArray, counts: LongArray, unguessed: LongArray
                           ) -> list[int]:
        """The pool ran short: the guesses already granted go back before anyone is preempted (a guess never
        costs another sequence its blocks). Returns the positions whose tables shrank."""
        shrunk = np.flatnonzero(counts > unguessed).tolist()
        for i in shrunk:
            end = int(self.rows.computed[rows[i]] + unguessed[i])
            self.kv.truncate(ids[i], end, self.running[i].token_ids)
        return shrunk

    def _running_index(self) -> tuple[tuple[int, ...], LongArray]:
        """Seq ids and rows of the running list, rebuilt only when a row changed hands (the list did too)."""
        if self._index[0] != self.rows.version:
            self._index = (self.rows.version, tuple(s.seq_id for s in self.running),
                           np.array([s.row for s in self.running], np.int64))
        return self._index[1], self._index[2]

    def _admit(self, budget: int, chosen: _Chosen, time: PrefillTime | None) -> None:
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
            self._admit_one(self.waiting.popleft(), cached + count, chosen)
            budget -= count

    def _admit_one(self, seq: Sequence, num_tokens: int, chosen: _Chosen) -> None:
        cached = self.kv.allocate(seq.seq_id, seq.token_ids, num_tokens)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = cached
        seq.status = SequenceStatus.RUNNING
        self._insert_running(seq, cached)
        chosen.add(seq, cached, num_tokens - cached)

    def _plan(self, chosen: _Chosen, copies: BlockCopies, preempted: list[Sequence],
              failed: list[Sequence]) -> SchedulerPlan:
        rows, starts, counts = chosen.columns()
        self.rows.advance(rows, starts + counts)  # the backend computes them before the next plan
        built = build_batch(self._step_id, chosen.seqs, chosen.seq_ids, rows, starts, counts, self.rows,
                            self.kv.block_size, copies, chosen.drafts())
        batch, prefill = built.batch, built.prefill
        prefill_tokens = int(counts[prefill].sum())
        shape = None if self.cost is None else batch.shape()
        return SchedulerPlan(self._step_id, batch, chosen.seqs, rows, starts, counts, built.sampled, built.forks,
                             preempted, failed, chosen.admitted, tuple(prefill.tolist()), prefill_tokens,
                             batch.num_tokens - prefill_tokens, shape,
                             0.0 if shape is None or self.cost is None else self.cost.predict(shape),
                             self.rows.version, built.verify)

    def _may_admit(self) -> bool:
        return self.config.batching == "continuous" or not self._batch_decoding

    def _propose(self) -> Proposals | None:
        """The decoding sequences' guesses for this step, when speculation is on and any has one."""
        if self.speculator is None or not self.running:
            return None
        self.speculator.next_step()
        _, rows = self._running_index()
        proposals = propose(self.speculator, self.running, rows, self.rows,
                            None if self.cost is None else self.cost.coefficients)
        self.speculator.take_drafts({})  # a draft's guesses are for the step they were made for
        return proposals

    def draft_jobs(self) -> list[DraftJob]:
        """What to ask the draft model for before the next step is planned ([] without one)."""
        if self.speculator is None or not self.speculator.drafts or not self.running:
            return []
        _, rows = self._running_index()
        return draft_jobs(self.speculator, self.running, rows, self.rows,
                          None if self.cost is None else self.cost.coefficients)

    def _prefill_time(self, proposals: Proposals | None = None) -> PrefillTime | None:
        """The target's time left for prefill after the decode part (guesses included), when a target is set and
        someone decodes (with nobody decoding, prefill stalls no one and runs at the full token budget)."""
        target = self.itl_target
        if self.cost is None or target.ms <= 0 or not self.running:
            return None
        _, rows = self._running_index()
        starts, known = self.rows.computed[rows], self.rows.num_tokens[rows]
        decoding = (known - starts == 1)
        if not (decoding & (known > self.rows.prompt_lens[rows])).any():
            return None
        n, context = int(decoding.sum()), int((starts[decoding] + 1).sum())
        guessed = 0 if proposals is None else proposals.total
        shape = StepShape(n + guessed, n + guessed, context + guessed, context + guessed * (context // n))
        decode = self.cost.coefficients.seconds(shape)
        self.itl_limit_s = target.limit_seconds(decode, n, len(self.waiting) + len(rows) - n)
        # The planner fills steps up to the limit, so a fit 1 % low would put most of them just over: aim under.
        limit = AIM * self.itl_limit_s / self.cost.headroom
        return PrefillTime(self.cost.coefficients, limit, decode, n, self.config.min_prefill_chunk)

    # --- applying a step's results ---------------------------------------------------------------
    def update(self, plan: SchedulerPlan, output: StepOutput) -> StepUpdates:
        """Append each sampled token, fork pending choices, and finish sequences that hit a stop."""
        if plan.batch is None or not plan.sampled:
            return StepUpdates([], [])
        updates = self._apply(plan, output, None) if plan.verify is None else self._verify(plan, output)
        if updates.seqs and self.config.batching == "static":
            self._batch_decoding = bool(self.running)
        return updates

    def _verify(self, plan: SchedulerPlan, output: StepOutput) -> StepUpdates:
        """A step with guesses: each sequence's sampled tokens up to and including the first that differs from
        its guess, applied in rounds (a token each) so that stops end a sequence where they occur; then the
        slots and uniforms of rejected guesses go back (scheduler/guesses.py)."""
        assert plan.verify is not None and self.speculator is not None
        verify, samples = plan.verify, output.token_ids
        accepted = [_agreed(samples, int(first), guesses)
                    for first, guesses in zip(verify.first.tolist(), verify.guesses, strict=True)]
        lengths = [plan.sampled[first].num_tokens for first in verify.first.tolist()]
        rounds = [self._apply(plan, output, verify.first)]
        for r in range(1, max(accepted, default=0) + 1):
            groups = np.flatnonzero(np.array(accepted) >= r)
            rounds.append(self._apply(plan, output, verify.first[groups] + r, first=False))
        # a stop ends a sequence amid its kept guesses: those after it were never its tokens
        appended = [plan.sampled[first].num_tokens - n for first, n in zip(verify.first.tolist(), lengths, strict=True)]
        kept = [min(a, max(0, n - 1)) for a, n in zip(accepted, appended, strict=True)]
        settle_guesses(plan, kept, self.speculator, self.kv, self.rows)
        return joined(rounds)

    def _apply(self, plan: SchedulerPlan, output: StepOutput, at: LongArray | None, first: bool = True
               ) -> StepUpdates:
        """The sampled tokens at output rows `at` (None: all) appended, one per sequence; the `first` call of a
        step forks its pending choices."""
        assert plan.batch is not None
        intact = plan.version == self.rows.version  # no row changed hands since planning: nothing ended
        if first:
            self._fork_children(plan.forks)
        seqs, token_array = plan.sampled, output.token_ids
        rows, index = plan.rows[plan.batch.sample_rows], at  # the rows whose parameters each sampled with
        if at is not None:
            seqs, token_array, rows = [seqs[i] for i in at.tolist()], token_array[at], rows[at]
        tokens = token_array.tolist()
        if not intact:
            keep, seqs, tokens = _running_only(seqs, tokens)
            rows, token_array = rows[keep], token_array[keep]
            index = np.array(keep, np.int64) if at is None else at[keep]
        maybe_stopped = self.rows.stops.candidates(rows, token_array, self.rows.num_tokens[rows] + 1)
        renumbered = not intact or (first and bool(plan.forks))
        own = np.array([s.row for s in seqs], np.int64) if renumbered else rows
        self.rows.append_tokens(seqs, own, tokens, token_array)
        finished = self._finish_stopped(seqs, maybe_stopped)
        allowed = plan.batch.sampling.allowed if plan.batch.sampling is not None else None
        broken: dict[str, str] = {}
        if isinstance(allowed, PendingMasks):
            finished |= self._follow_guides(seqs, tokens, allowed, broken)
        logprobs = token_logprobs(output, seqs, tokens, None if index is None else index.tolist())
        return StepUpdates(seqs, tokens, finished, logprobs, broken)

    def _finish_stopped(self, seqs: list[Sequence], maybe_stopped: np.ndarray) -> frozenset[int]:
        """check_token_stop decides, for the few sequences the NumPy pre-check could not rule out."""
        finished = []
        for i in np.flatnonzero(maybe_stopped).tolist():
            stop = check_token_stop(seqs[i], self.eos_ids, self.max_seq_len)
            if stop is not None:
                self.finish(seqs[i], stop.status, stop.stop_reason)
                finished.append(i)
        return frozenset(finished)

    def _follow_guides(self, seqs: list[Sequence], tokens: list[int], masks: PendingMasks,
                       broken: dict[str, str]) -> frozenset[int]:
        """Each guided sequence's grammar follows its token; one whose grammar is complete stops here, and one
        whose grammar failed (a matcher's resource limit) goes into `broken`, for its request to fail."""
        masks.wait()  # the mask thread is done with these guides
        done = []
        for i, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            if seq.guide is None or not seq.guide.consume(token) or seq.status.finished:
                continue
            if seq.guide.error is not None:  # the engine fails the request (not a "stop": the text breaks the rule)
                log.info("request %s: the grammar engine says: %s", seq.request_id, seq.guide.detail)
                broken[seq.request_id] = seq.guide.error
                continue
            self.finish(seq, SequenceStatus.FINISHED_STOPPED)
            done.append(i)
        return frozenset(done)

    def _fork_children(self, parents: list[Sequence]) -> None:
        for seq in parents:
            if seq.status is SequenceStatus.RUNNING and seq.children:
                for child in seq.children:
                    self.kv.fork(seq.seq_id, child.seq_id)
                    child.status = SequenceStatus.RUNNING
                    self._insert_running(child, seq.num_computed_tokens)
                seq.children = []

    def stop_on_string(self, seq: Sequence, stop: str) -> None:
        """A stop string in the output ends the sequence; it outranks a token-level stop of the same token."""
        if seq.status.finished:
            seq.status, seq.stop_reason = SequenceStatus.FINISHED_STOPPED, stop
        else:
            self.finish(seq, SequenceStatus.FINISHED_STOPPED, stop)

    def check_rows(self) -> None:
        """The persistent rows index exactly the running sequences, their tokens and their KV pool block tables
        (O(rows)); raises RowMismatchError."""
        tables = {s.seq_id: self.kv.block_table(s.seq_id) for s in self.running}
        windows = {s.seq_id: self.kv.window_table(s.seq_id) for s in self.running} if self.kv.window_blocks else None
        self.rows.check(self.running, tables, self.kv.block_size, windows)

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

    def _insert_running(self, seq: Sequence, computed: int) -> None:
        """Into the running list, and a row with the block table the KV manager just gave it and the tokens
        whose KV that table already holds."""
        if self._by_priority:
            keys = [s.sort_key(True) for s in self.running]
            self.running.insert(bisect.bisect(keys, seq.sort_key(True)), seq)
        else:
            self.running.append(seq)
        blocks, window = kv_tables(self.kv, seq.seq_id)
        self.rows.add(seq, blocks, computed, window)

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


def _drop_idle(chosen: _Chosen) -> None:
    """Leave out of the step the running sequences given no tokens."""
    rows, starts, counts = chosen.running
    keep = np.flatnonzero(counts > 0)
    index = keep.tolist()
    chosen.seqs = [chosen.seqs[i] for i in index]
    chosen.seq_ids = [chosen.seq_ids[i] for i in index]
    chosen.running = rows[keep], starts[keep], counts[keep]
    if chosen.guesses is not None:
        chosen.guesses = Drafts(chosen.guesses.counts[keep], [chosen.guesses.tokens[i] for i in index])


def _agreed(samples: LongArray, first: int, guesses: list[int]) -> int:
    """How many guesses the model's own samples (from row `first` on) agree with, from the first."""
    agreed = 0
    for guess, sample in zip(guesses, samples[first : first + len(guesses)].tolist(), strict=True):
        if guess != sample:
            break
        agreed += 1
    return agreed


def _running_only(seqs: list[Sequence], tokens: list[int]) -> tuple[list[int], list[Sequence], list[int]]:
    """Drop the sequences aborted while the step ran: (their positions kept, sequences, tokens)."""
    index = [i for i, seq in enumerate(seqs) if seq.status is SequenceStatus.RUNNING]
    return index, [seqs[i] for i in index], [tokens[i] for i in index]


def _speculator(config: SpeculativeConfig | None, draft: DraftModel | None) -> Speculator | None:
    if config is None or not config.enabled:
        return None
    if (config.speculative_method == "draft") != (draft is not None):
        raise ValueError("speculative_method 'draft' needs a draft model, and only it takes one")
    return Speculator(config, None if draft is None else draft.forget)
