"""The paged KV cache as NumPy arrays: per layer, K and V shaped (num_blocks, block_size, kv_heads, head_dim), in
float32 or float16 (a write rounds to nearest even; attention widens each value back to float32 exactly)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PagedKVCache:
    keys: list[np.ndarray]
    values: list[np.ndarray]

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: np.dtype | type = np.float32) -> PagedKVCache:
        shape = (num_blocks, block_size, kv_heads, head_dim)
        return cls([np.zeros(shape, dtype) for _ in range(num_layers)],
                   [np.zeros(shape, dtype) for _ in range(num_layers)])

    @property
    def block_size(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def num_blocks(self) -> int:
        return int(self.keys[0].shape[0])

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store one layer's new K/V (T, kv_heads, head_dim) at flat slot ids; negative slots are padding."""
        keep = slots >= 0
        if not keep.all():
            slots, k, v = slots[keep], k[keep], v[keep]
        kv_heads, head_dim = k.shape[1:]
        self.keys[layer].reshape(-1, kv_heads, head_dim)[slots] = k
        self.values[layer].reshape(-1, kv_heads, head_dim)[slots] = v

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: block dst becomes a copy of block src in every layer."""
        if not pairs:
            return
        src = np.array([p[0] for p in pairs])
        dst = np.array([p[1] for p in pairs])
        for cache in (*self.keys, *self.values):
            cache[dst] = cache[src]
