"""A draft model's proposals (`speculative_method = draft`): a second, smaller model with the served model's
tokenizer, run by a backend of its own over a KV pool of its own, guesses each guessing sequence's next k
tokens greedily.

It runs in the engine's step thread, between steps, never on the event loop: the engine takes each guessing
sequence's tokens and guess count on the loop (`DraftJob`, Scheduler.draft_jobs), has `propose` run them in the
step thread, and plans the step with the guesses. A greedy guess is a point mass, so verification keeps it
when the model's own sample equals it, as for prompt lookup: the output is unchanged, greedy or sampled.

The draft's pool holds, per sequence, the KV of the tokens it was last fed: those still the sequence's (a
prefix) are kept, the rest (its guesses the model did not keep) given back, and the tokens new since are fed
as one chunk whose last row gives the first guess; each further guess is one decode row for every sequence
still guessing. A sequence the pool cannot hold gets no guesses: the draft never preempts anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.base import Backend, SamplingInputs, StepBatch
from kvpool import KVCacheManager, KVInvariantError


@dataclass(frozen=True)
class DraftJob:
    """One sequence's request to the draft: its tokens (not a copy: only the engine task appends to them, and it
    waits for the draft) and how many tokens to guess after them."""

    seq_id: int
    tokens: Sequence[int]
    k: int


@dataclass
class _Fed:
    """What the draft's pool holds of one sequence: the tokens fed, the first `sure` of them known to be the
    sequence's own (a sequence's tokens only grow, so they stay its own)."""

    tokens: list[int] = field(default_factory=list)
    sure: int = 0


class DraftModel:
    def __init__(self, backend: Backend, kv: KVCacheManager) -> None:
        self.backend = backend
        self.kv = kv
        self._fed: dict[int, _Fed] = {}
        self._ended: deque[int] = deque()  # sequences ended on the loop, freed in the step thread

    def forget(self, seq_id: int) -> None:
        """On the event loop, when a sequence ends: its blocks go back at the next proposal."""
        self._ended.append(seq_id)

    def propose(self, jobs: Sequence[DraftJob]) -> dict[int, list[int]]:
        """In the step thread: each job's guesses (fewer, or none, where the draft's pool runs out)."""
        self._free_ended()
        for job in jobs:
            self._rewind(job)
        ready = list(jobs)
        guesses: dict[int, list[int]] = {job.seq_id: [] for job in ready}
        feeds = [list(job.tokens[len(self._fed[job.seq_id].tokens):]) for job in ready]
        for step in range(max((job.k for job in ready), default=0)):
            if step:
                ready = [job for job in ready if job.k > step]
                feeds = [[guesses[job.seq_id][-1]] for job in ready]
            ready, feeds = self._covered(ready, feeds)
            if not ready:
                break
            tokens = self.backend.execute(self._step_batch(ready, feeds)).token_ids
            for job, token in zip(ready, tokens.tolist(), strict=True):
                guesses[job.seq_id].append(int(token))
        return guesses

    def check_invariants(self) -> None:
        """The pool's bookkeeping, and a table for each sequence fed that covers what it was fed."""
        self.kv.check_invariants()
        for seq_id, fed in self._fed.items():
            if not fed.tokens:
                continue
            if not self.kv.has_sequence(seq_id):
                raise KVInvariantError(f"draft: sequence {seq_id} was fed but has no table")
            if len(self.kv.block_table(seq_id)) * self.kv.block_size < len(fed.tokens):
                raise KVInvariantError(f"draft: sequence {seq_id}'s table is short of the tokens it was fed")

    def _free_ended(self) -> None:
        while self._ended:
            seq_id = self._ended.popleft()
            self._fed.pop(seq_id, None)
            if self.kv.has_sequence(seq_id):
                self.kv.free(seq_id)

    def _rewind(self, job: DraftJob) -> None:
        """Keep the KV of the tokens fed that are still the sequence's (all but its last, at most: the last is
        fed again for its logits); give back the rest."""
        fed = self._fed.setdefault(job.seq_id, _Fed())
        keep = _common_prefix(fed.tokens, job.tokens, fed.sure, len(job.tokens) - 1)
        if keep < len(fed.tokens):
            self.kv.truncate(job.seq_id, keep, job.tokens)
            del fed.tokens[keep:]
        fed.sure = keep

    def _covered(self, jobs: list[DraftJob], feeds: list[list[int]]) -> tuple[list[DraftJob], list[list[int]]]:
        """The jobs whose new tokens got their slots in the pool (the others keep what they had)."""
        kept = [(job, feed) for job, feed in zip(jobs, feeds, strict=True) if self._cover(job.seq_id, feed)]
        return [job for job, _ in kept], [feed for _, feed in kept]

    def _cover(self, seq_id: int, feed: list[int]) -> bool:
        """Slots for `feed` after what the sequence was fed: a table when it has none yet (nothing fed)."""
        fed = self._fed[seq_id].tokens
        fed.extend(feed)
        if self.kv.has_sequence(seq_id):
            covered = self.kv.append([seq_id], [fed], [len(feed)])[0] == 1
        elif covered := self.kv.can_allocate(fed, len(fed)):
            self.kv.allocate(seq_id, fed, len(fed))
        if not covered:
            del fed[len(fed) - len(feed):]
        return covered

    def _step_batch(self, jobs: list[DraftJob], feeds: list[list[int]]) -> StepBatch:
        """A step of each sequence's new tokens (those just covered), sampling its last one greedily."""
        size = self.kv.block_size
        tables = [self.kv.block_table(job.seq_id) for job in jobs]
        ends = np.array([len(self._fed[job.seq_id].tokens) for job in jobs], np.int64)
        counts = np.array([len(feed) for feed in feeds], np.int64)
        positions = np.concatenate([np.arange(end - n, end) for end, n in zip(ends, counts, strict=True)])
        padded = np.zeros((len(jobs), max(len(t) for t in tables)), np.int32)
        for row, table in enumerate(tables):
            padded[row, : len(table)] = table
        owner = np.repeat(np.arange(len(jobs)), counts)
        slots = padded[owner, positions // size].astype(np.int64) * size + positions % size
        return StepBatch(tuple(job.seq_id for job in jobs), np.concatenate(feeds).astype(np.int32),
                         positions.astype(np.int32), slots, np.concatenate(([0], np.cumsum(counts))).astype(np.int32),
                         ends.astype(np.int32), padded, np.arange(len(jobs), dtype=np.int32), _greedy(len(jobs)))


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int, most: int) -> int:
    """How many first items a and b share (at most `most`), the first `start` known to be shared."""
    end = min(len(a), len(b), most)
    for i in range(min(start, end), end):
        if a[i] != b[i]:
            return i
    return end


def _greedy(rows: int) -> SamplingInputs:
    zeros = np.zeros(rows, np.float32)
    return SamplingInputs(temperature=zeros, top_k=np.zeros(rows, np.int32), top_p=np.ones(rows, np.float32),
                          min_p=zeros, uniforms=zeros)
