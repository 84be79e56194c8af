"""Turns the scheduler's decisions into a StepBatch: flat token/position/slot arrays and padded tables.

The decisions arrive as columns (StepWork), one entry per scheduled sequence; block tables and slot ids come
from the persistent rows (PersistentBatch) with NumPy gathers, so a step builds no object per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from backends.base import IntArray, LongArray, SamplingInputs, StepBatch
from scheduler.block_table import BlockTable, Index
from scheduler.persistent_batch import TokenColumns
from scheduler.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    """One scheduled sequence, for readers that want an object per sequence (tests, debugging)."""

    seq: Sequence
    start: int  # first token position computed this step
    num_tokens: int  # tokens computed this step

    @property
    def is_prefill(self) -> bool:
        """Prompt tokens, or tokens recomputed after a preemption, rather than one decode token."""
        return self.num_tokens > 1 or self.start < self.seq.prompt_len

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence's known tokens (so a next token is due)."""
        return self.start + self.num_tokens == self.seq.num_tokens


@dataclass(frozen=True)
class StepColumns:
    """The scheduled sequences' numbers as arrays, in batch order."""

    rows: LongArray  # persistent rows
    starts: IntArray  # first position computed this step
    counts: IntArray  # tokens computed this step
    num_tokens: LongArray  # tokens each knew when planned


@dataclass
class StepWork:
    """A step's scheduled sequences in batch order: the running ones come in bulk, as arrays; admitted ones
    are added one at a time."""

    seqs: list[Sequence] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    token_lists: list[list[int]] = field(default_factory=list)  # each one's token_ids
    running: StepColumns = field(default_factory=lambda: StepColumns(
        np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64)))
    admitted: list[Sequence] = field(default_factory=list)
    _added: list[tuple[int, int, int, int]] = field(default_factory=list)  # admitted: row, start, count, tokens

    def add(self, seq: Sequence, row: int, start: int, count: int) -> None:
        self.seqs.append(seq)
        self.seq_ids.append(seq.seq_id)
        self.token_lists.append(seq.token_ids)
        self.admitted.append(seq)
        self._added.append((row, start, count, seq.num_tokens))

    def columns(self) -> StepColumns:
        run = self.running
        if not self._added:
            return run
        rows, starts, counts, num_tokens = np.array(self._added, np.int64).T
        return StepColumns(np.concatenate((run.rows, rows)), np.concatenate((run.starts, starts.astype(np.int32))),
                           np.concatenate((run.counts, counts.astype(np.int32))),
                           np.concatenate((run.num_tokens, num_tokens)))


@dataclass(frozen=True)
class Samples:
    """Who samples this step. Choices still to fork sample from their parent's batch row (and fork after it)."""

    batch_rows: IntArray  # StepBatch.sample_rows
    seqs: list[Sequence]
    forked: list[int]  # positions in seqs of choices sampling for the first time, before they fork
    forks: list[Sequence]  # their parents


@dataclass(frozen=True)
class StepLayout:
    """Where the step's tokens go and who samples: the StepBatch besides its block tables and slots."""

    query_start: IntArray
    positions: IntArray
    token_rows: LongArray  # the persistent row of each token
    token_ids: IntArray
    samples: Samples
    prefill: Index  # which scheduled sequences compute prompt tokens (or recompute), not one decode token


def lay_out(work: StepWork, cols: StepColumns, tokens: TokenColumns) -> StepLayout:
    prompt_lens = tokens.prompt_lens[cols.rows]
    return _decode_layout(work, cols, prompt_lens, tokens.last) or _general_layout(work, cols, prompt_lens)


def _decode_layout(work: StepWork, cols: StepColumns, prompt_lens: LongArray, last: LongArray
                   ) -> StepLayout | None:
    """The usual step, when every sequence decodes its next token: its last one, at its last position."""
    if work.admitted or not ((cols.starts + 1) == cols.num_tokens).all() or (cols.starts < prompt_lens).any():
        return None
    samples = Samples(np.arange(len(cols.rows), dtype=np.int32), work.seqs, [], [])
    return StepLayout(np.arange(len(cols.rows) + 1, dtype=np.int32), cols.starts.copy(), cols.rows,
                      last[cols.rows].astype(np.int32), samples, np.zeros(0, np.int64))


def _general_layout(work: StepWork, cols: StepColumns, prompt_lens: LongArray) -> StepLayout:
    query_start = np.zeros(len(cols.counts) + 1, np.int32)
    np.cumsum(cols.counts, out=query_start[1:])
    num_tokens = int(query_start[-1])
    # each sequence's positions run from its start: offset each token's flat index by its row's
    positions = np.repeat(cols.starts - query_start[:-1], cols.counts) + np.arange(num_tokens, dtype=np.int32)
    samples = find_samples(work, cols.starts + cols.counts == cols.num_tokens, cols.num_tokens == prompt_lens)
    prefill = np.flatnonzero((cols.counts > 1) | (cols.starts < prompt_lens))
    return StepLayout(query_start, positions, np.repeat(cols.rows, cols.counts), _flat_tokens(work, cols), samples,
                      prefill)


def find_samples(work: StepWork, samples: np.ndarray, first: np.ndarray) -> Samples:
    """`samples`: which scheduled sequences reach their last known token; `first`: which have no output yet
    (only those can carry choices still to fork: a parent forks them the step it first samples)."""
    rows = np.flatnonzero(samples)
    if any(work.seqs[i].children for i in np.flatnonzero(samples & first).tolist()):
        return _with_choices(work, rows.tolist())
    seqs = work.seqs if len(rows) == len(work.seqs) else [work.seqs[i] for i in rows.tolist()]
    return Samples(rows.astype(np.int32), seqs, [], [])


def _with_choices(work: StepWork, rows: list[int]) -> Samples:
    batch_rows: list[int] = []
    seqs: list[Sequence] = []
    forked: list[int] = []
    forks: list[Sequence] = []
    for i in rows:
        head = work.seqs[i]
        if head.children:
            forks.append(head)
            forked.extend(range(len(seqs) + 1, len(seqs) + 1 + len(head.children)))
        for seq in (head, *head.children):
            batch_rows.append(i)
            seqs.append(seq)
    return Samples(np.array(batch_rows, np.int32), seqs, forked, forks)


def _flat_tokens(work: StepWork, cols: StepColumns) -> IntArray:
    out: list[int] = []
    for tokens, start, count in zip(work.token_lists, cols.starts.tolist(), cols.counts.tolist(), strict=True):
        out += tokens[start : start + count]
    return np.array(out, np.int32)


def build_step_batch(step_id: int, work: StepWork, cols: StepColumns, layout: StepLayout, blocks: BlockTable,
                     block_size: int, sampling: SamplingInputs | None,
                     block_copies: list[tuple[int, int]]) -> StepBatch:
    return StepBatch(
        seq_ids=tuple(work.seq_ids),
        token_ids=layout.token_ids,
        positions=layout.positions,
        slot_mapping=blocks.slots(layout.token_rows, layout.positions, block_size),
        query_start=layout.query_start,
        context_lens=cols.starts + cols.counts,
        block_tables=blocks.padded(cols.rows),
        sample_rows=layout.samples.batch_rows,
        sampling=sampling,
        block_copies=tuple(block_copies),
        step_id=step_id,
    )
