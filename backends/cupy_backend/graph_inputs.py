"""A decode graph's inputs: device arrays allocated once per batch-size bucket, at addresses the captured
launches read on every replay, refreshed before each replay with the step's values (one transfer per dtype).

Rows past the step's sequences are padding: token 0 at position 0, slot -1 (rope_and_cache writes no cache slot
for a negative one), context length 0 (the decode kernels give such a row zeros and read no block) and a block
table of zeros; greedy sampling. So a padded row never touches a real sequence's KV blocks. Where the cache has a
window pool, its tables and slots have buffers of their own beside the others, padded alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import SamplingInputs, StepBatch
from backends.cupy_backend.step_inputs import DeviceStep


@dataclass(frozen=True)
class StaticInputs:
    """int32: token ids, positions, context lengths, block tables, window tables where there is a window pool
    (refreshed), then query_start (constant); int64: slot mapping, window slots where there is a window pool
    (refreshed), then the sampled rows (constant); float32: temperature, min_p, uniforms."""

    xp: Any
    ints: Any
    longs: Any
    floats: Any
    step: DeviceStep  # views into the buffers above, shaped as the forward reads a step

    @property
    def rows(self) -> int:
        return self.step.num_seqs

    @property
    def max_blocks(self) -> int:
        return self.step.max_blocks

    @property
    def pools(self) -> int:
        """The KV pools the step's tables and slots address: 2 with a window pool."""
        return 1 if self.step.window_tables is None else 2

    def fill(self, batch: StepBatch) -> None:
        """The step's inputs into the first rows, padding into the rest."""
        n, b, m, pools = batch.num_seqs, self.rows, self.max_blocks, self.pools
        ints = np.zeros(3 * b + pools * b * m, np.int32)
        for i, values in enumerate((batch.token_ids, batch.positions, batch.context_lens)):
            ints[i * b : i * b + n] = values
        slots = np.full((pools, b), -1, np.int64)
        for p, (table, slot) in enumerate(_pool_inputs(batch)[:pools]):
            ints[3 * b + p * b * m :].reshape(-1, m)[:n, : table.shape[1]] = table
            slots[p, :n] = slot
        self.ints[: ints.size] = self.xp.asarray(ints)
        self.longs[: slots.size] = self.xp.asarray(slots.reshape(-1))

    def fill_sampling(self, params: SamplingInputs) -> None:
        n, b = len(params.temperature), self.rows
        floats = np.zeros(3 * b, np.float32)  # padded rows: greedy
        for i, values in enumerate((params.temperature, params.min_p, params.uniforms)):
            floats[i * b : i * b + n] = values
        self.floats[...] = self.xp.asarray(floats)

    @property
    def sampling(self) -> tuple[Any, Any, Any]:
        """(temperature, min_p, uniforms) views."""
        b = self.rows
        return self.floats[:b], self.floats[b : 2 * b], self.floats[2 * b :]


def _pool_inputs(batch: StepBatch) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tables, slots) of each KV pool the step addresses: the full one, then the window pool's if it has one."""
    window = [] if batch.window_tables is None or batch.window_slots is None else [
        (batch.window_tables, batch.window_slots)]
    return [(batch.block_tables, batch.slot_mapping), *window]


def allocate_inputs(xp: Any, rows: int, max_blocks: int, block_size: int, window_pool: bool = False) -> StaticInputs:
    """A bucket's buffers, holding padding. The step's context bound is the tables' whole width, so the launches
    are sized for any context a replay may bring (the partitioned decode skips the partitions past a context)."""
    b, m, pools = rows, max_blocks, 2 if window_pool else 1
    tables_end = 3 * b + pools * b * m
    ints = xp.asarray(np.concatenate([np.zeros(tables_end, np.int32), np.arange(b + 1, dtype=np.int32)]))
    longs = xp.asarray(np.concatenate([np.full(pools * b, -1, np.int64), np.arange(b, dtype=np.int64)]))
    tables = [ints[3 * b + p * b * m : 3 * b + (p + 1) * b * m].reshape(b, m) for p in range(pools)]
    slots = [longs[p * b : (p + 1) * b] for p in range(pools)]
    window = {"window_tables": tables[1], "window_slots": slots[1]} if window_pool else {}
    step = DeviceStep(token_ids=ints[:b], positions=ints[b : 2 * b], query_start=ints[tables_end:],
                      context_lens=ints[2 * b : 3 * b], block_tables=tables[0], slot_mapping=slots[0],
                      sample_rows=longs[pools * b :], num_tokens=b, num_seqs=b, max_query_len=1,
                      max_context_len=m * block_size, **window)
    return StaticInputs(xp, ints, longs, xp.zeros(3 * b, xp.float32), step)
