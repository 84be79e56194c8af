"""Turns the scheduler's decisions into a StepBatch: flat token/position/slot arrays and padded tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import StepBatch
from scheduler.sampling_inputs import build_sampling_inputs
from scheduler.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # first token position computed this step
    num_tokens: int  # tokens computed this step
    slots: list[int]
    block_table: list[int]

    @property
    def is_prefill(self) -> bool:
        """Prompt tokens, or tokens recomputed after a preemption, rather than one decode token."""
        return self.num_tokens > 1 or self.start < self.seq.prompt_len

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the sequence's known tokens (so a next token is due)."""
        return self.start + self.num_tokens == self.seq.num_tokens


def build_step_batch(step_id: int, scheduled: list[ScheduledSeq], block_copies: list[tuple[int, int]],
                     eos_ids: frozenset[int]) -> tuple[StepBatch, list[Sequence]]:
    """The batch, and the sequences sampled (one per `sample_rows` entry, forked children included)."""
    token_ids = np.fromiter(_flat_tokens(scheduled), np.int32)
    slots = np.fromiter((slot for s in scheduled for slot in s.slots), np.int64)
    counts = np.array([s.num_tokens for s in scheduled], np.int32)
    query_start = np.zeros(len(scheduled) + 1, np.int32)
    np.cumsum(counts, out=query_start[1:])
    # each sequence's positions run from its start: offset every token's index in the flat batch by its row's
    starts = np.array([s.start for s in scheduled], np.int32)
    positions = np.repeat(starts - query_start[:-1], counts) + np.arange(query_start[-1], dtype=np.int32)
    rows, sampled = _sample_rows(scheduled)
    batch = StepBatch(
        seq_ids=tuple(s.seq.seq_id for s in scheduled),
        token_ids=token_ids,
        positions=positions,
        slot_mapping=slots,
        query_start=query_start,
        context_lens=np.array([s.start + s.num_tokens for s in scheduled], np.int32),
        block_tables=_padded_tables(scheduled),
        sample_rows=np.array(rows, np.int32),
        sampling=build_sampling_inputs(sampled, eos_ids) if sampled else None,
        block_copies=tuple(block_copies),
        step_id=step_id,
    )
    return batch, sampled


def _flat_tokens(scheduled: list[ScheduledSeq]) -> list[int]:
    out: list[int] = []
    for s in scheduled:
        out += s.seq.token_ids[s.start : s.start + s.num_tokens]
    return out


def _sample_rows(scheduled: list[ScheduledSeq]) -> tuple[list[int], list[Sequence]]:
    """A row per sampled sequence; choices waiting to fork sample from their parent's row."""
    rows: list[int] = []
    seqs: list[Sequence] = []
    for i, s in enumerate(scheduled):
        if s.samples:
            for seq in (s.seq, *s.seq.children):
                rows.append(i)
                seqs.append(seq)
    return rows, seqs


def _padded_tables(scheduled: list[ScheduledSeq]) -> np.ndarray:
    width = max(len(s.block_table) for s in scheduled)
    tables = np.zeros((len(scheduled), width), np.int32)
    for i, s in enumerate(scheduled):
        tables[i, : len(s.block_table)] = s.block_table
    return tables
