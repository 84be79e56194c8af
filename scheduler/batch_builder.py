"""Turns the scheduler's decisions into a StepBatch: flat token/position/slot arrays and padded tables.

The decisions arrive as columns, one entry per scheduled sequence in batch order; token counts, block tables,
slot ids and sampling parameters come from the persistent rows (PersistentBatch) with NumPy gathers, so a step
builds no object per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from backends.base import IntArray, LongArray, StepBatch
from scheduler.block_table import Index
from scheduler.persistent_batch import PersistentBatch
from scheduler.sequence import Sequence


@dataclass(frozen=True)
class Drafts:
    """The guesses a step verifies, one entry per scheduled sequence in batch order (most have none)."""

    counts: IntArray  # (B,) guessed tokens each computes after its own
    tokens: list[list[int]]  # (B,) the guesses

    @property
    def total(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class Verify:
    """Where a step's samples of guessed positions are: one group of sample rows per sampled sequence, its own
    token's first, then one per guess."""

    first: LongArray  # (G,) each group's first sample row
    counts: IntArray  # (G,) its guesses
    guesses: list[list[int]]  # (G,)


@dataclass(frozen=True)
class _Layout:
    """Where the step's tokens go, and who samples: the StepBatch besides its tables, slots and sampling."""

    query_start: IntArray
    positions: IntArray
    token_rows: LongArray  # the persistent row of each token
    token_ids: IntArray
    prefill: Index  # which scheduled sequences compute prompt tokens (or recompute), not one decode token
    sample_rows: IntArray  # StepBatch.sample_rows; choices still to fork sample from their parent's batch row
    sampled: list[Sequence]  # one per sample row
    forked: list[int]  # positions in sampled of choices sampling for the first time, before they fork
    forks: list[Sequence]  # their parents
    sample_lag: IntArray | None = None  # StepBatch.sample_lag
    verify: Verify | None = None
    guessed: list[list[int]] | None = None  # per sample row, the guesses before its position


# A step's pending copy-on-write copies (src, dst): the KV pool's, and the sliding layers' pool's where it exists
BlockCopies = tuple[list[tuple[int, int]], list[tuple[int, int]] | None]


@dataclass(frozen=True)
class Built:
    """A step's StepBatch and what the scheduler keeps of its layout."""

    batch: StepBatch
    sampled: list[Sequence]  # one per batch.sample_rows entry
    forks: list[Sequence]  # parents whose pending choices fork with this step
    prefill: Index  # indices into the scheduled sequences of those that compute prompt tokens
    verify: Verify | None  # the guesses' sample rows, when the step verifies guesses


def build_batch(step_id: int, seqs: list[Sequence], seq_ids: list[int], rows: LongArray, starts: IntArray,
                counts: IntArray, persistent: PersistentBatch, block_size: int,
                block_copies: BlockCopies, drafts: Drafts | None = None) -> Built:
    """The step that computes counts[i] tokens of seqs[i] (row rows[i]) from position starts[i], the last
    drafts.counts[i] of them guesses. block_copies: the KV pool's pending copies, and those of the sliding
    layers' pool where they have one (their tables and slots go with the step then)."""
    layout = _lay_out(seqs, rows, starts, counts, persistent, drafts)
    sampling = None
    if layout.sampled:
        sampling = persistent.sampling_inputs(rows[layout.sample_rows], layout.sampled, layout.forked,
                                              layout.guessed)
    batch = StepBatch(
        seq_ids=tuple(seq_ids),
        token_ids=layout.token_ids,
        positions=layout.positions,
        slot_mapping=persistent.blocks.slots(layout.token_rows, layout.positions, block_size),
        query_start=layout.query_start,
        context_lens=starts + counts,
        block_tables=persistent.blocks.padded(rows),
        sample_rows=layout.sample_rows,
        sampling=sampling,
        block_copies=tuple(block_copies[0]),
        step_id=step_id,
        sample_lag=layout.sample_lag,
        **_window_fields(persistent, rows, layout, block_size, block_copies[1]),
    )
    return Built(batch, layout.sampled, layout.forks, layout.prefill, layout.verify)


def _window_fields(persistent: PersistentBatch, rows: LongArray, layout: _Layout, block_size: int,
                   copies: list[tuple[int, int]] | None) -> dict[str, Any]:
    """The sliding layers' tables, slots and copies, where they have a pool of their own (copies not None)."""
    if copies is None:
        return {}
    tables = persistent.window_blocks
    return {"window_tables": tables.padded(rows), "window_block_copies": tuple(copies),
            "window_slots": tables.slots(layout.token_rows, layout.positions, block_size)}


def _lay_out(seqs: list[Sequence], rows: LongArray, starts: IntArray, counts: IntArray,
             persistent: PersistentBatch, drafts: Drafts | None) -> _Layout:
    prompt_lens, num_tokens = persistent.prompt_lens[rows], persistent.num_tokens[rows]
    if drafts is not None:
        return _general_layout(seqs, rows, starts, counts, num_tokens, prompt_lens, drafts)
    if ((starts + 1) == num_tokens).all() and (starts >= prompt_lens).all():
        return _decode_layout(seqs, rows, starts, persistent.last)
    return _general_layout(seqs, rows, starts, counts, num_tokens, prompt_lens)


def _decode_layout(seqs: list[Sequence], rows: LongArray, starts: IntArray, last: LongArray) -> _Layout:
    """The usual step, when every sequence decodes its next token: its last one, at its last position."""
    every = np.arange(len(rows), dtype=np.int32)
    return _Layout(np.arange(len(rows) + 1, dtype=np.int32), starts.copy(), rows, last[rows].astype(np.int32),
                   np.zeros(0, np.int64), every, seqs, [], [])


def _general_layout(seqs: list[Sequence], rows: LongArray, starts: IntArray, counts: IntArray,
                    num_tokens: LongArray, prompt_lens: LongArray, drafts: Drafts | None = None) -> _Layout:
    """Any step; with `drafts`, the last drafts.counts[i] of counts[i] are seqs[i]'s guesses, after its own
    token, each position of a guessing sequence sampled."""
    query_start = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=query_start[1:])
    total = int(query_start[-1])
    # each sequence's positions run from its start: offset each token's flat index by its row's
    positions = np.repeat(starts - query_start[:-1], counts) + np.arange(total, dtype=np.int32)
    known = counts if drafts is None else counts - drafts.counts
    samples = np.flatnonzero(starts + known == num_tokens)
    sample_rows, sampled, forked, forks = _samples(seqs, samples, num_tokens == prompt_lens)
    prefill = np.flatnonzero((known > 1) | (starts < prompt_lens))
    tokens = _flat_tokens(seqs, starts, known, None if drafts is None else drafts.tokens)
    layout = _Layout(query_start, positions, np.repeat(rows, counts), tokens, prefill, sample_rows, sampled,
                     forked, forks)
    return layout if drafts is None else _with_guesses(layout, drafts)


def _with_guesses(layout: _Layout, drafts: Drafts) -> _Layout:
    """The layout's sample rows with a run per guessing sequence: its own position's, then one per guess."""
    guesses = drafts.counts[layout.sample_rows]
    reps = 1 + guesses
    first = np.zeros(len(reps), np.int64)
    np.cumsum(reps[:-1], out=first[1:])
    within = np.arange(int(reps.sum()), dtype=np.int32) - np.repeat(first, reps).astype(np.int32)
    sampled = [seq for seq, n in zip(layout.sampled, reps.tolist(), strict=True) for _ in range(n)]
    verify = Verify(first, guesses.astype(np.int32), [drafts.tokens[i] for i in layout.sample_rows.tolist()])
    before = [row[:j] for row, n in zip(verify.guesses, reps.tolist(), strict=True) for j in range(n)]
    return replace(layout, sample_rows=np.repeat(layout.sample_rows, reps), sampled=sampled,
                   forked=[int(first[i]) for i in layout.forked],
                   sample_lag=np.repeat(guesses, reps).astype(np.int32) - within, verify=verify, guessed=before)


def _samples(seqs: list[Sequence], samples: Index, first: np.ndarray
             ) -> tuple[IntArray, list[Sequence], list[int], list[Sequence]]:
    """`samples`: the scheduled sequences that reach their last known token; `first`: which have no output yet
    (only those can carry choices still to fork: a parent forks them the step it first samples)."""
    if any(seqs[i].children for i in samples[first[samples]].tolist()):
        return _with_choices(seqs, samples.tolist())
    sampled = seqs if len(samples) == len(seqs) else [seqs[i] for i in samples.tolist()]
    return samples.astype(np.int32), sampled, [], []


def _with_choices(seqs: list[Sequence], samples: list[int]
                  ) -> tuple[IntArray, list[Sequence], list[int], list[Sequence]]:
    sample_rows: list[int] = []
    sampled: list[Sequence] = []
    forked: list[int] = []
    forks: list[Sequence] = []
    for i in samples:
        head = seqs[i]
        if head.children:
            forks.append(head)
            forked.extend(range(len(sampled) + 1, len(sampled) + 1 + len(head.children)))
        for seq in (head, *head.children):
            sample_rows.append(i)
            sampled.append(seq)
    return np.array(sample_rows, np.int32), sampled, forked, forks


def _flat_tokens(seqs: list[Sequence], starts: IntArray, counts: IntArray,
                 guesses: list[list[int]] | None = None) -> IntArray:
    out: list[int] = []
    for i, (seq, start, count) in enumerate(zip(seqs, starts.tolist(), counts.tolist(), strict=True)):
        out += seq.token_ids[start : start + count]
        if guesses is not None:
            out += guesses[i]
    return np.array(out, np.int32)
