"""The sliding layers' own KV pool as the KV manager keeps it, for tests that feed a backend StepBatches with
window_tables and window_slots by hand (a backend's window pool: init_cache's window_blocks)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from backends.base import StepBatch


class WindowPool:
    """The window pool's blocks: drawn in shuffled order; given back once wholly before the first position a
    sequence's step attends to (-1 in its table from then on), and drawn again by others."""

    def __init__(self, blocks: int, block_size: int, window: int, seed: int = 0) -> None:
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(blocks)]
        self.block_size, self.window = block_size, window
        self.blocks: dict[int, dict[int, int]] = {}  # sequence -> logical block -> window pool block
        self.gave_back = 0

    def window_first(self, position: int) -> int:
        """The first position a query at `position` attends to."""
        return max(0, position - self.window + 1)

    def place(self, batch: StepBatch) -> StepBatch:
        """batch with its window tables (a block wider than its block tables) and slots."""
        size = self.block_size
        for b, seq in enumerate(batch.seq_ids):
            first = self.window_first(int(batch.positions[batch.query_start[b]]))
            self._give_back(self.blocks.setdefault(seq, {}), first)
            for i in range(first // size, -(-int(batch.context_lens[b]) // size)):
                if i not in self.blocks[seq]:
                    self.blocks[seq][i] = self.free.pop()
        tables = np.zeros((batch.num_seqs, batch.block_tables.shape[1] + 1), np.int32)
        for b, seq in enumerate(batch.seq_ids):
            n = -(-int(batch.context_lens[b]) // size)
            tables[b, :n] = [self.blocks[seq].get(i, -1) for i in range(n)]
        rows = np.repeat(np.arange(batch.num_seqs), np.diff(batch.query_start))
        slots = tables[rows, batch.positions // size].astype(np.int64) * size + batch.positions % size
        return replace(batch, window_tables=tables, window_slots=slots)

    def _give_back(self, blocks: dict[int, int], first: int) -> None:
        for i in [i for i in blocks if (i + 1) * self.block_size <= first]:
            self.free.append(blocks.pop(i))
            self.gave_back += 1
