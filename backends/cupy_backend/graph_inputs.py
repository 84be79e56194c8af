"""A decode graph's inputs: device arrays allocated once per batch-size bucket, at addresses the captured
launches read on every replay, refreshed before each replay with the step's values (one transfer per dtype).

Rows past the step's sequences are padding: token 0 at position 0, slot -1 (rope_and_cache writes no cache slot
for a negative one), context length 0 (the decode kernels give such a row zeros and read no block) and a block
table of zeros; greedy sampling. So a padded row never touches a real sequence's KV blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import SamplingInputs, StepBatch
from backends.cupy_backend.step_inputs import DeviceStep


@dataclass(frozen=True)
class StaticInputs:
    """int32: token ids, positions, context lengths, block tables (refreshed), then query_start (constant);
    int64: slot mapping (refreshed), then the sampled rows (constant); float32: temperature, min_p, uniforms."""

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

    def fill(self, batch: StepBatch) -> None:
        """The step's inputs into the first rows, padding into the rest."""
        n, b, m = batch.num_seqs, self.rows, self.max_blocks
        ints = np.zeros(3 * b + b * m, np.int32)
        for i, values in enumerate((batch.token_ids, batch.positions, batch.context_lens)):
            ints[i * b : i * b + n] = values
        ints[3 * b :].reshape(b, m)[:n, : batch.block_tables.shape[1]] = batch.block_tables
        slots = np.full(b, -1, np.int64)
        slots[:n] = batch.slot_mapping
        self.ints[: ints.size] = self.xp.asarray(ints)
        self.longs[:b] = self.xp.asarray(slots)

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


def allocate_inputs(xp: Any, rows: int, max_blocks: int, block_size: int) -> StaticInputs:
    """A bucket's buffers, holding padding. The step's context bound is the tables' whole width, so the launches
    are sized for any context a replay may bring (the partitioned decode skips the partitions past a context)."""
    b, m = rows, max_blocks
    ints = xp.asarray(np.concatenate([np.zeros(3 * b + b * m, np.int32), np.arange(b + 1, dtype=np.int32)]))
    longs = xp.asarray(np.concatenate([np.full(b, -1, np.int64), np.arange(b, dtype=np.int64)]))
    step = DeviceStep(token_ids=ints[:b], positions=ints[b : 2 * b], query_start=ints[3 * b + b * m :],
                      context_lens=ints[2 * b : 3 * b], block_tables=ints[3 * b : 3 * b + b * m].reshape(b, m),
                      slot_mapping=longs[:b], sample_rows=longs[b:], num_tokens=b, num_seqs=b, max_query_len=1,
                      max_context_len=m * block_size)
    return StaticInputs(xp, ints, longs, xp.zeros(3 * b, xp.float32), step)
