"""A StepBatch's arrays on the device, in few transfers: every int32 array packed into one host buffer and sent
at once, likewise the int64 ones; the device arrays are views into the two buffers. Sampling inputs travel the
same way, so `sampling.sample` never copies anything per field. Sizes the launches need stay on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from backends.base import SamplingInputs, StepBatch


def upload(xp: Any, arrays: dict[str, np.ndarray], dtype: type[np.generic]) -> dict[str, Any]:
    """One host-to-device copy for all `arrays` (cast to dtype); returns device views shaped like the inputs."""
    flat = [np.ascontiguousarray(a, dtype=dtype).ravel() for a in arrays.values()]
    device = xp.asarray(np.concatenate(flat) if flat else np.zeros(0, dtype))
    views, offset = {}, 0
    for (name, host), part in zip(arrays.items(), flat, strict=True):
        views[name] = device[offset : offset + part.size].reshape(np.shape(host))
        offset += part.size
    return views


@dataclass(frozen=True)
class DeviceStep:
    """A step's inputs on the device, and the host-side sizes the kernel launches are computed from."""

    token_ids: Any  # (T,) int32
    positions: Any  # (T,) int32
    query_start: Any  # (B + 1,) int32
    context_lens: Any  # (B,) int32
    block_tables: Any  # (B, max_blocks) int32
    slot_mapping: Any  # (T,) int64
    sample_rows: Any  # (S,) int64: the token row of each sampled sequence's last token
    num_tokens: int
    num_seqs: int
    max_query_len: int
    max_context_len: int
    window_tables: Any = None  # (B, W) int32: the window pool's tables, where the cache has one
    window_slots: Any = None  # (T,) int64: the window pool's slots

    @property
    def decode_only(self) -> bool:
        """One query token per sequence: the decode kernel's case."""
        return self.max_query_len == 1 and self.num_tokens == self.num_seqs

    @property
    def max_blocks(self) -> int:
        return int(self.block_tables.shape[1])

    def in_window_pool(self) -> DeviceStep:
        """The step as a layer in the window pool reads it: that pool's tables and slots."""
        assert self.window_tables is not None and self.window_slots is not None
        return replace(self, block_tables=self.window_tables, slot_mapping=self.window_slots)


def upload_step(xp: Any, batch: StepBatch) -> DeviceStep:
    last_rows = batch.sample_token_rows()
    ints = upload(
        xp,
        {
            "token_ids": batch.token_ids,
            "positions": batch.positions,
            "query_start": batch.query_start,
            "context_lens": batch.context_lens,
            "block_tables": batch.block_tables,
            **({} if batch.window_tables is None else {"window_tables": batch.window_tables}),
        },
        np.int32,
    )
    window_slots = {} if batch.window_slots is None else {"window_slots": batch.window_slots}
    longs = upload(xp, {"slot_mapping": batch.slot_mapping, "sample_rows": last_rows, **window_slots}, np.int64)
    q_lens = np.diff(batch.query_start)
    return DeviceStep(
        **ints,
        **longs,
        num_tokens=batch.num_tokens,
        num_seqs=batch.num_seqs,
        max_query_len=int(q_lens.max()) if q_lens.size else 0,
        max_context_len=int(batch.context_lens.max()) if batch.context_lens.size else 0,
    )


FLOAT_FIELDS = ("temperature", "top_p", "min_p", "uniforms", "presence_penalty", "frequency_penalty",
                "repetition_penalty")
INT_FIELDS = ("top_k", "output_token_ids", "prompt_token_ids", "suppressed_token_ids")


def upload_sampling(xp: Any, params: SamplingInputs) -> SamplingInputs:
    """The same sampling inputs with every array on the device (two transfers); None fields stay None.
    top_k travels as int64, the type sampling widens it to anyway."""
    floats = {f: getattr(params, f) for f in FLOAT_FIELDS if getattr(params, f) is not None}
    ints = {f: getattr(params, f) for f in INT_FIELDS if getattr(params, f) is not None}
    return replace(params, **upload(xp, floats, np.float32), **upload(xp, ints, np.int64))
