"""The running sequences' rows: per-sequence arrays kept across steps (as vLLM v1's persistent input batch).

A sequence gets a row when it starts running (admitted, forked) and gives it back when it stops (finished,
preempted). Its row holds what a step needs of it as arrays: its block table, its sampling parameters, its
stop conditions, its prompt length. What changes per step is patched into the row; what does not is written
once. A step then gathers its rows in batch order, instead of building an object per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from backends.base import LongArray
from kvpool import TableChange
from scheduler.block_table import BlockTable, Index, grown
from scheduler.sampling_inputs import SamplingColumns
from scheduler.sequence import Sequence
from scheduler.stop import StopColumns


@dataclass
class TokenColumns:
    """Per row, mirrored from its Sequence: prompt length, tokens with KV computed (num_computed_tokens), tokens
    known (len(token_ids)) and the last of them, so a step reads each with one gather."""

    prompt_lens: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))
    computed: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))
    known: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))
    last: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))

    def set_row(self, row: int, seq: Sequence) -> None:
        if row >= len(self.known):
            self.prompt_lens, self.computed, self.known, self.last = (
                grown(column, row + 1) for column in (self.prompt_lens, self.computed, self.known, self.last))
        self.prompt_lens[row], self.computed[row] = seq.prompt_len, seq.num_computed_tokens
        self.known[row], self.last[row] = len(seq.token_ids), seq.token_ids[-1]

    def appended(self, rows: Index, tokens: LongArray) -> None:
        """Each of these rows' sequences got one more token."""
        self.known[rows] += 1
        self.last[rows] = tokens


@dataclass
class PersistentBatch:
    eos_ids: frozenset[int]
    max_model_len: int
    blocks: BlockTable = field(default_factory=BlockTable)
    sampling: SamplingColumns = field(default_factory=SamplingColumns)
    stops: StopColumns = field(init=False)
    tokens: TokenColumns = field(default_factory=TokenColumns)
    rows: dict[int, int] = field(default_factory=dict)  # seq_id -> row
    seqs: list[Sequence | None] = field(default_factory=list)  # row -> its sequence
    version: int = 0  # changes whenever a row changes hands: it keys what steps reuse
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stops = StopColumns(self.eos_ids, self.max_model_len)

    def add(self, seq: Sequence, blocks: list[int]) -> int:
        """A row for a sequence that starts running, with its block table as the KV manager has it."""
        row = self._free.pop() if self._free else len(self.seqs)
        if row == len(self.seqs):
            self.seqs.append(None)
        self.rows[seq.seq_id], self.seqs[row] = row, seq
        self.tokens.set_row(row, seq)
        self.blocks.set_row(row, blocks)
        self.sampling.set_row(row, seq)
        self.stops.set_row(row, seq)
        self.version += 1
        return row

    def remove(self, seq: Sequence) -> None:
        row = self.rows.pop(seq.seq_id)
        self.blocks.clear_row(row)
        self.sampling.clear_row(row, seq)
        self.seqs[row] = None
        self._free.append(row)
        self.version += 1

    def patch_blocks(self, rows: LongArray, changes: list[TableChange]) -> None:
        """Apply KVCacheManager.append's changes: (index into rows, block index, block id)."""
        if changes:
            index, positions, blocks = np.array(changes, np.int64).T
            self.blocks.patch(rows[index], positions, blocks)

    def check(self, running: list[Sequence], kv_tables: dict[int, list[int]]) -> None:
        """Every running sequence has a row that mirrors it and its block table (for tests; O(rows))."""
        assert sorted(self.rows) == sorted(s.seq_id for s in running), "a row per running sequence"
        for seq in running:
            row = self.rows[seq.seq_id]
            assert self.seqs[row] is seq
            assert self.blocks.row(row) == kv_tables[seq.seq_id], f"seq {seq.seq_id}: block table"
            assert (self.tokens.prompt_lens[row], self.tokens.computed[row], self.tokens.known[row],
                    self.tokens.last[row]) == (seq.prompt_len, seq.num_computed_tokens, seq.num_tokens,
                                               seq.token_ids[-1]), f"seq {seq.seq_id}: token columns"
