"""Build StepBatches by hand, for callers without a scheduler: backend tests and micro-benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.base import SamplingInputs, StepBatch


@dataclass
class SeqState:
    """A sequence under test: its tokens so far and the physical blocks it owns."""

    blocks: list[int]
    tokens: list[int] = field(default_factory=list)

    def slots(self, start: int, end: int, block_size: int) -> list[int]:
        return [self.blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


def make_batch(seqs: Sequence[SeqState], chunks: Sequence[Sequence[int]], block_size: int,
               sample: bool = True) -> StepBatch:
    """One step in which seqs[i] processes chunks[i] (appended to its tokens); every seq is sampled greedily."""
    token_ids, positions, slots, starts, ctx = [], [], [], [0], []
    for seq, chunk in zip(seqs, chunks, strict=True):
        begin = len(seq.tokens)
        seq.tokens.extend(chunk)
        token_ids += list(chunk)
        positions += list(range(begin, len(seq.tokens)))
        slots += seq.slots(begin, len(seq.tokens), block_size)
        starts.append(len(token_ids))
        ctx.append(len(seq.tokens))
    width = max(len(s.blocks) for s in seqs)
    tables = np.zeros((len(seqs), width), np.int32)
    for i, seq in enumerate(seqs):
        tables[i, : len(seq.blocks)] = seq.blocks
    rows = np.arange(len(seqs), dtype=np.int32)
    return StepBatch(
        seq_ids=tuple(range(len(seqs))),
        token_ids=np.array(token_ids, np.int32),
        positions=np.array(positions, np.int32),
        slot_mapping=np.array(slots, np.int64),
        query_start=np.array(starts, np.int32),
        context_lens=np.array(ctx, np.int32),
        block_tables=tables,
        sample_rows=rows if sample else rows[:0],
        sampling=greedy(len(seqs)) if sample else None,
    )


def greedy(n: int) -> SamplingInputs:
    zeros = np.zeros(n, np.float32)
    return SamplingInputs(temperature=zeros, top_k=np.zeros(n, np.int32), top_p=np.ones(n, np.float32),
                          min_p=zeros, uniforms=zeros)
