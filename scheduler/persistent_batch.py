"""The running sequences' rows: per-sequence arrays kept across steps (as vLLM v1's persistent input batch).

A sequence gets a row when it starts running (admitted, forked) and gives it back when it stops (finished,
preempted). Its row holds what a step needs of it as arrays, so a step gathers its rows in batch order
instead of building an object per sequence. Each column has one writer:

- `computed` (tokens whose KV is computed) lives only here: the scheduler advances it when it plans a step, and
  `Sequence.num_computed_tokens` reads it through the sequence's row.
- `num_tokens` and `last` index the sequence's own token list; `append_tokens` is the one place a running
  sequence's tokens grow, and it writes the list and these columns together.
- `blocks` copies the KV pool's block tables, which only the pool changes: a row is set from the pool's table
  and then patched only with the changes the pool's `append` reports.
- `prompt_lens`, `sampling` and `stops` derive from the sequence's fixed parameters, written when it gets a row.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from backends.base import LongArray, SamplingInputs
from kvpool import KVCacheManager, TableChange
from scheduler.block_table import BlockTable, Index, grown
from scheduler.sampling_inputs import SamplingColumns
from scheduler.sequence import Sequence
from scheduler.stop import StopColumns

_TOKEN_COLUMNS = ("prompt_lens", "computed", "num_tokens", "last")


class RowMismatchError(Exception):
    """The rows do not index the running sequences, their tokens or the KV pool's block tables."""


def _column() -> LongArray:
    return np.zeros(8, np.int64)


@dataclass
class PersistentBatch:
    eos_ids: frozenset[int]
    max_model_len: int
    blocks: BlockTable = field(default_factory=BlockTable)
    window_blocks: BlockTable = field(default_factory=BlockTable)  # the sliding layers' tables, where they have a pool
    sampling: SamplingColumns = field(default_factory=SamplingColumns)
    stops: StopColumns = field(init=False)
    prompt_lens: LongArray = field(default_factory=_column)
    computed: LongArray = field(default_factory=_column)
    num_tokens: LongArray = field(default_factory=_column)
    last: LongArray = field(default_factory=_column)
    seqs: list[Sequence | None] = field(default_factory=list)  # row -> its sequence (Sequence.row is the inverse)
    version: int = 0  # changes whenever a row changes hands: it keys what steps reuse
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stops = StopColumns(self.eos_ids, self.max_model_len)

    # --- rows changing hands ---------------------------------------------------------------------
    def add(self, seq: Sequence, blocks: list[int], computed: int, window_blocks: list[int] | None = None) -> None:
        """A row for a sequence that starts running, with its block tables as the KV pool has them and the tokens
        whose KV it already holds (a cached prefix, or a forked parent's)."""
        row = self._free.pop() if self._free else len(self.seqs)
        if row == len(self.seqs):
            self.seqs.append(None)
            self._fit(row)
        self.seqs[row], seq.row, seq.counters = seq, row, self
        self.prompt_lens[row], self.computed[row] = seq.prompt_len, computed
        self.num_tokens[row], self.last[row] = len(seq.token_ids), seq.token_ids[-1]
        self.set_tables(row, blocks, window_blocks)
        self.sampling.set_row(row, seq)
        self.stops.set_row(row, seq)
        self.version += 1

    def remove(self, seq: Sequence) -> None:
        """The sequence stops running: its row goes back, and with it its computed count (its KV is freed)."""
        row = seq.row
        self.blocks.clear_row(row)
        self.window_blocks.clear_row(row)
        self.sampling.clear_row(row, seq)
        self.seqs[row], seq.row, seq.counters = None, -1, None
        self._free.append(row)
        self.version += 1

    # --- a step's changes --------------------------------------------------------------------------
    def advance(self, rows: Index, ends: Index) -> None:
        """A step computes these rows' tokens up to `ends` (the backend writes their KV before the next plan)."""
        self.computed[rows] = ends

    def append_tokens(self, seqs: list[Sequence], rows: Index, tokens: list[int], token_array: LongArray) -> None:
        """seqs[i], in row rows[i], sampled tokens[i]: the only place a running sequence's tokens grow."""
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids.append(token)
        self.num_tokens[rows] += 1
        self.last[rows] = token_array

    def set_tables(self, row: int, blocks: list[int], window_blocks: list[int] | None = None) -> None:
        """A row's tables, whole, as the KV pool has them (window_blocks: where the sliding layers have a pool)."""
        self.blocks.set_row(row, blocks)
        if window_blocks is not None:
            self.window_blocks.set_row(row, window_blocks)

    def patch_blocks(self, rows: LongArray, changes: list[TableChange]) -> None:
        """Apply KVCacheManager.append's changes: (index into rows, block index, block id, group)."""
        if not changes:
            return
        index, positions, blocks, groups = np.array(changes, np.int64).T
        if not groups.any():
            self.blocks.patch(rows[index], positions, blocks)
            return
        for table, mine in ((self.blocks, groups == 0), (self.window_blocks, groups == 1)):
            if mine.any():
                table.patch(rows[index[mine]], positions[mine], blocks[mine])

    def sampling_inputs(self, rows: Index, seqs: list[Sequence], forked: list[int],
                        guessed: Seq[Seq[int]] | None = None) -> SamplingInputs:
        """See SamplingColumns.inputs: seqs[i] samples with row rows[i]'s parameters."""
        return self.sampling.inputs(rows, seqs, forked, self.eos_ids, self.version, self.seqs, guessed)

    # --- checking ----------------------------------------------------------------------------------
    def check(self, running: list[Sequence], kv_tables: dict[int, list[int]], block_size: int,
              window_tables: dict[int, list[int]] | None = None) -> None:
        """A row per running sequence and none else, each indexing its tokens and its KV pool block tables, and
        counting no more computed tokens than those blocks hold (O(rows)). Raises RowMismatchError."""
        taken = [seq for seq in self.seqs if seq is not None]
        _expect(sorted(s.seq_id for s in taken) == sorted(s.seq_id for s in running),
                "the rows do not hold exactly the running sequences")
        for seq in running:
            self._check_row(seq, kv_tables[seq.seq_id], block_size)
            if window_tables is not None:
                row = self.window_blocks.row(seq.row)
                _expect(row == window_tables[seq.seq_id],
                        f"seq {seq.seq_id}: window row {row}, KV pool {window_tables[seq.seq_id]}")

    def _check_row(self, seq: Sequence, table: list[int], block_size: int) -> None:
        row = seq.row
        _expect(0 <= row < len(self.seqs) and self.seqs[row] is seq and seq.counters is self,
                f"seq {seq.seq_id}: not in its row {row}")
        _expect(self.blocks.row(row) == table, f"seq {seq.seq_id}: row {self.blocks.row(row)}, KV pool {table}")
        indexed = (int(self.prompt_lens[row]), int(self.num_tokens[row]), int(self.last[row]))
        actual = (seq.prompt_len, seq.num_tokens, seq.token_ids[-1])
        _expect(indexed == actual, f"seq {seq.seq_id}: row has (prompt, tokens, last) {indexed}, it has {actual}")
        computed = int(self.computed[row])
        _expect(0 <= computed <= min(seq.num_tokens, len(table) * block_size),
                f"seq {seq.seq_id}: {computed} computed tokens, {seq.num_tokens} tokens, {len(table)} blocks")

    def _fit(self, row: int) -> None:
        if row >= len(self.computed):
            for name in _TOKEN_COLUMNS:
                setattr(self, name, grown(getattr(self, name), row + 1))


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise RowMismatchError(message)


def kv_tables(kv: KVCacheManager, seq_id: int) -> tuple[list[int], list[int] | None]:
    """A sequence's tables as the KV pool has them: its block table, and its window table where the sliding
    layers have a pool of their own (else None)."""
    return kv.block_table(seq_id), kv.window_table(seq_id) if kv.window_blocks else None
