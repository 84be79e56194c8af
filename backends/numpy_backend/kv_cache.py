"""The paged KV cache as NumPy arrays: per layer, K and V shaped (num_blocks, block_size, kv_heads, head_dim), in
float32 or float16 (a write rounds to nearest even; attention widens each value back to float32 exactly).

With a window pool, the sliding layers (`window_layers`) hold fewer blocks than the others: their own pool, with
its own block ids (StepBatch.window_tables / window_slots)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PagedKVCache:
    keys: list[np.ndarray]
    values: list[np.ndarray]
    window_layers: frozenset[int] = frozenset()  # the layers in the window pool; empty: one pool for all

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: np.dtype | type = np.float32, window_layers: Collection[int] = (),
                 window_blocks: int = 0) -> PagedKVCache:
        """window_blocks > 0: the layers in window_layers hold that many blocks (the window pool); 0: every
        layer holds num_blocks."""
        in_window = frozenset(window_layers) if window_blocks > 0 else frozenset()
        shapes = [(window_blocks if i in in_window else num_blocks, block_size, kv_heads, head_dim)
                  for i in range(num_layers)]
        return cls([np.zeros(shape, dtype) for shape in shapes], [np.zeros(shape, dtype) for shape in shapes],
                   in_window)

    @property
    def block_size(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def num_blocks(self) -> int:
        """The full pool's blocks (the layers outside the window pool)."""
        return next((int(k.shape[0]) for i, k in enumerate(self.keys) if i not in self.window_layers), 0)

    @property
    def window_blocks(self) -> int:
        """The window pool's blocks; 0: no window pool."""
        return next((int(self.keys[i].shape[0]) for i in sorted(self.window_layers)), 0)

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store one layer's new K/V (T, kv_heads, head_dim) at flat slot ids; negative slots are padding."""
        keep = slots >= 0
        if not keep.all():
            slots, k, v = slots[keep], k[keep], v[keep]
        kv_heads, head_dim = k.shape[1:]
        self.keys[layer].reshape(-1, kv_heads, head_dim)[slots] = k
        self.values[layer].reshape(-1, kv_heads, head_dim)[slots] = v

    def copy_blocks(self, pairs: Sequence[tuple[int, int]], window_pairs: Sequence[tuple[int, int]] = ()) -> None:
        """Copy-on-write: block dst becomes a copy of block src, by `pairs` in every layer of the full pool, by
        `window_pairs` in every layer of the window pool."""
        if window_pairs and not self.window_layers:
            raise ValueError("window block copies for a cache without a window pool")
        for layers, moves in (([i for i in range(len(self.keys)) if i not in self.window_layers], pairs),
                              (sorted(self.window_layers), window_pairs)):
            if moves:
                _copy(layers, self.keys, self.values, moves)


def _copy(layers: Sequence[int], keys: list[np.ndarray], values: list[np.ndarray],
          pairs: Sequence[tuple[int, int]]) -> None:
    src = np.array([p[0] for p in pairs])
    dst = np.array([p[1] for p in pairs])
    for i in layers:
        for cache in (keys[i], values[i]):
            cache[dst] = cache[src]
