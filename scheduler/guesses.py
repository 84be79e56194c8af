"""The scheduler's side of speculative decoding: which running sequences guess this step and how many tokens,
and, once the step is verified, giving back what rejected guesses took (their KV slots and uniforms).

A guessing sequence's row computes its own next token and its guesses; its KV table grows over all of them
when the step is planned, as any append does, but the blocks the guesses fill are published in the prefix
cache only once they are accepted (kvpool's truncate()), so a rejected guess's KV is never shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import LongArray
from backends.step_shape import CostCoefficients, StepShape
from kvpool import KVCacheManager
from scheduler.batch_builder import Drafts
from scheduler.draft import DraftJob
from scheduler.persistent_batch import PersistentBatch, kv_tables
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.speculation import Speculator
from scheduler.step import SchedulerPlan


@dataclass(frozen=True)
class Proposals:
    """The running sequences' guesses, in running order."""

    lens: LongArray  # (R,) guesses per running sequence
    tokens: dict[int, list[int]]  # position in running order -> its guesses

    @property
    def total(self) -> int:
        return int(self.lens.sum())

    def fitted(self, room: int) -> LongArray | None:
        """The guess counts cut, last sequences first, to `room` tokens in all; None when none fits."""
        if room <= 0:
            return None
        if self.total <= room:
            return self.lens
        before = np.cumsum(self.lens) - self.lens
        return np.clip(room - before, 0, self.lens)


def propose(speculator: Speculator, running: list[Sequence], rows: LongArray, persistent: PersistentBatch,
            cost: CostCoefficients | None) -> Proposals | None:
    """Guesses for the running sequences that may guess (`guessers`), as many as `cost` says are worth it (None:
    as many as allowed) and, for a guided sequence, as its grammar accepts; None when none has any."""
    who, threshold = guessers(running, rows, persistent, cost)
    lens = np.zeros(len(rows), np.int64)
    tokens: dict[int, list[int]] = {}
    for i, seq, room in who:
        guesses = speculator.propose(seq.seq_id, seq.token_ids, room, threshold)
        if guesses and seq.guide is not None:  # what its grammar refuses is no guess: cut before verifying
            guesses = guesses[: seq.guide.allowed_run(guesses)]
        if guesses:
            lens[i], tokens[i] = len(guesses), guesses
    return Proposals(lens, tokens) if tokens else None


def draft_jobs(speculator: Speculator, running: list[Sequence], rows: LongArray, persistent: PersistentBatch,
               cost: CostCoefficients | None) -> list[DraftJob]:
    """What the draft model is asked for before the step is planned: each sequence that may guess (`guessers`),
    with as many guesses as are worth it."""
    who, threshold = guessers(running, rows, persistent, cost)
    jobs = [DraftJob(seq.seq_id, seq.token_ids, speculator.wanted(seq.seq_id, room, threshold))
            for _, seq, room in who]
    return [job for job in jobs if job.k]


def guessers(running: list[Sequence], rows: LongArray, persistent: PersistentBatch, cost: CostCoefficients | None
             ) -> tuple[list[tuple[int, Sequence, int]], float]:
    """The running sequences that decode their next token, may guess (no penalties, no min_tokens still to
    reach) and have room under their length limit: (position in running order, the sequence, its room); and
    the chance of being kept a guess must have to be worth its row (guess_threshold; 0 without a cost model)."""
    known, computed = persistent.num_tokens[rows], persistent.computed[rows]
    room = persistent.stops.limit[rows] - known - 1  # k + 1 new tokens must stay within max_tokens and the context
    may = (known - computed == 1) & (known > persistent.prompt_lens[rows]) & (room > 0)
    may &= persistent.sampling.may_guess(rows)
    if not may.any():
        return [], 0.0
    threshold = 0.0 if cost is None else guess_threshold(cost, known - computed == 1, known)
    who = [(i, running[i], int(room[i])) for i in np.flatnonzero(may).tolist()
           if running[i].num_output_tokens >= running[i].params.min_tokens]
    return who, threshold


def guess_threshold(cost: CostCoefficients, decoding: np.ndarray, known: LongArray) -> float:
    """What one more guessed row adds to the step's decode part, over the time per token of that part: a guess
    is worth making when the chance it is kept is at least this."""
    n = int(decoding.sum())
    if n == 0:
        return 0.0
    context = int(known[decoding].sum())
    step_s = cost.seconds(StepShape(n, n, context, context))
    each = context // n
    more_s = cost.seconds(StepShape(n + 1, n + 1, context + 1, context + each)) - step_s  # its KV and reads
    return more_s * n / step_s if step_s > 0 else 0.0


def drafts_of(proposals: Proposals, granted: LongArray) -> Drafts:
    """The first granted[i] guesses of each of the first len(granted) running sequences."""
    counts = np.maximum(granted, 0).astype(np.int32)
    return Drafts(counts, [proposals.tokens.get(i, [])[:n] for i, n in enumerate(counts.tolist())])


def settle_guesses(plan: SchedulerPlan, accepted: list[int], speculator: Speculator, kv: KVCacheManager,
                   persistent: PersistentBatch) -> None:
    """After a verified step: each guessing sequence still running counts only its kept tokens as computed, its
    KV table gives back the slots of rejected guesses (and publishes the blocks kept ones filled), and its
    unused uniforms are drawn again next step; the speculator learns how its guesses fared."""
    assert plan.verify is not None
    verify = plan.verify
    for first, guessed, kept in zip(verify.first.tolist(), verify.counts.tolist(), accepted, strict=True):
        if guessed == 0:
            continue
        seq = plan.sampled[first]
        speculator.observe(seq.seq_id, guessed, kept)
        if seq.status is SequenceStatus.RUNNING:
            _give_back(seq, guessed - kept, kv, persistent)


def _give_back(seq: Sequence, rejected: int, kv: KVCacheManager, persistent: PersistentBatch) -> None:
    row = seq.row
    persistent.computed[row] -= rejected
    kv.truncate(seq.seq_id, int(persistent.computed[row]), seq.token_ids)
    persistent.set_tables(row, *kv_tables(kv, seq.seq_id))
    if rejected and persistent.sampling.random[row]:
        persistent.sampling.ahead.give_back(row, rejected)
