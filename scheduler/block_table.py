"""Every running sequence's block table as one row of a padded array, kept across steps (as vLLM v1's
BlockTable): the scheduler writes a block id into a row only when the KV manager sets one, and a step gathers
its rows, and its slot ids, with NumPy instead of copying a list per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.base import IntArray, LongArray

Index = npt.NDArray[np.integer[Any]]  # row numbers or positions, whatever the integer type


def grown(array: np.ndarray, rows: int, cols: int = 0) -> np.ndarray:
    """`array`, or a zero-padded copy with at least `rows` rows (and, if 2-D, `cols` columns); it doubles what
    it grows, so rows and columns are added O(log n) times in all."""
    shape = list(array.shape)
    if rows > shape[0]:
        shape[0] = max(rows, 2 * shape[0])
    if array.ndim == 2 and cols > shape[1]:
        shape[1] = max(cols, 2 * shape[1])
    if tuple(shape) == array.shape:
        return array
    out = np.zeros(shape, array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


@dataclass
class BlockTable:
    """Row r holds the block ids of the sequence in row r, `num_blocks[r]` of them, then zeros."""

    table: IntArray = field(default_factory=lambda: np.zeros((8, 8), np.int32))
    num_blocks: IntArray = field(default_factory=lambda: np.zeros(8, np.int32))

    def set_row(self, row: int, blocks: list[int]) -> None:
        """The whole table of a sequence that just got a row (admitted, forked)."""
        self._fit(row, len(blocks))
        self.table[row, : len(blocks)] = blocks
        self.table[row, len(blocks) :] = 0
        self.num_blocks[row] = len(blocks)

    def clear_row(self, row: int) -> None:
        if row >= len(self.num_blocks):  # never set (the window tables of a model without a window pool)
            return
        self.table[row, : self.num_blocks[row]] = 0
        self.num_blocks[row] = 0

    def patch(self, rows: Index, indices: Index, blocks: Index) -> None:
        """The KV manager set entry indices[i] of row rows[i]'s table to blocks[i] (a new block, or a copy)."""
        self._fit(int(rows.max()), int(indices.max()) + 1)
        self.table[rows, indices] = blocks
        np.maximum.at(self.num_blocks, rows, indices + 1)

    def padded(self, rows: Index) -> IntArray:
        """The StepBatch's (B, max_blocks) tables: a fresh array, so later patches never reach a sent batch."""
        width = int(self.num_blocks[rows].max())
        return self.table[rows, :width]

    def slots(self, rows: Index, positions: IntArray, block_size: int) -> LongArray:
        """Slot id of each token: its row's block holding `position`, times block_size, plus the offset."""
        blocks = self.table[rows, positions // block_size].astype(np.int64)
        return blocks * block_size + positions % block_size

    def row(self, row: int) -> list[int]:
        return self.table[row, : self.num_blocks[row]].tolist()

    def _fit(self, row: int, cols: int) -> None:
        if row >= self.table.shape[0] or cols > self.table.shape[1]:
            self.table = grown(self.table, row + 1, cols)
            self.num_blocks = grown(self.num_blocks, self.table.shape[0])
