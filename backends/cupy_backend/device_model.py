"""The model's state on the device: weights uploaded once (dense in the storage dtype, or as the file stores
them: quant_weights.py), the rotary cos/sin tables (one per RoPE base the layers use), and the paged KV cache.

The KV cache is one array (layers, 2, num_blocks, block_size, kv_heads, head_dim): layer l's K and V are the
contiguous views [l, 0] and [l, 1], each shaped like the NumPy backend's per-layer cache, and a copy-on-write
block copy is one indexing operation over every layer at once. With a window pool (init_cache's window_blocks),
the sliding layers' K/V live in a second such array of window_blocks blocks, with its own block ids
(StepBatch.window_tables / window_slots), and `data` holds the other layers only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.base import BackendError, StepBatch
from backends.cupy_backend import reference
from backends.cupy_backend.quant_weights import upload_matrix
from backends.cupy_backend.storage import Storage

if TYPE_CHECKING:  # the loader imports gguf; the backend only needs the arrays
    from backends.model.config import ModelConfig
    from backends.model.quant import Matrix
    from backends.model.weights import LayerWeights, ModelWeights


@dataclass(frozen=True)
class DeviceLayer:
    """Matrices are dense device arrays in the storage dtype or DeviceQuant (quant_weights.py); the optional
    vectors (LayerWeights') are None where the architecture has none."""

    attn_norm: Any  # (H,)
    wqkv: Any  # (q_size + 2 kv_size, H)
    wo: Any  # (H, q_size)
    ffn_norm: Any  # (H,)
    w_gate_up: Any  # (2F, H)
    w_down: Any  # (H, F)
    q_norm: Any = None  # (head_dim,)
    k_norm: Any = None  # (head_dim,)
    post_attn_norm: Any = None  # (H,)
    post_ffn_norm: Any = None  # (H,)
    qkv_bias: Any = None  # (q_size + 2 kv_size,)


@dataclass(frozen=True)
class DeviceWeights:
    embedding: Any  # (V, H)
    layers: tuple[DeviceLayer, ...]
    final_norm: Any  # (H,)
    lm_head: Any  # (V, H): the same array as the embedding when tied
    rope_tables: dict[float, Any]  # RoPE base -> (max_position, head_dim) float32 cos/sin (reference.py's)

    @property
    def num_bytes(self) -> int:
        arrays = [self.embedding, self.final_norm, self.lm_head, *self.rope_tables.values()]
        arrays += [a for layer in self.layers for a in vars(layer).values() if a is not None]
        return sum(int(a.nbytes) for a in {id(a): a for a in arrays}.values())


def upload_weights(xp: Any, storage: Storage, config: ModelConfig, weights: ModelWeights) -> DeviceWeights:
    """Host weights -> device, each sent once (a tied head shares the embedding): a matrix kept as stored in a
    type the kernels read goes as its bytes, everything else dense in `storage`."""

    def put(a: Matrix) -> Any:
        return upload_matrix(xp, storage, a)

    embedding = put(weights.embedding)
    lm_head = embedding if weights.lm_head is weights.embedding else put(weights.lm_head)
    return DeviceWeights(
        embedding=embedding,
        layers=tuple(_layer(put, layer) for layer in weights.layers),
        final_norm=put(weights.final_norm),
        lm_head=lm_head,
        rope_tables={base: xp.asarray(table) for base, table in rope_tables(config).items()},
    )


def rope_tables(config: ModelConfig) -> dict[float, np.ndarray]:
    """A cos/sin table per RoPE base (ModelConfig.rope_bases: Gemma 3's sliding layers have their own), as the
    NumPy forward builds them."""
    return {base: reference.rope_cos_sin_cache(config.context_length, config.head_dim, base, factors)
            for base, factors in config.rope_bases().items()}


def _layer(put: Any, layer: LayerWeights) -> DeviceLayer:
    """Every tensor the layer has, each sent once."""
    return DeviceLayer(**{name: None if a is None else put(a) for name, a in vars(layer).items()})


class DeviceKVCache:
    def __init__(self, xp: Any, storage: Storage, num_layers: int, num_blocks: int, block_size: int,
                 kv_heads: int, head_dim: int, window_layers: Collection[int] = (), window_blocks: int = 0) -> None:
        """window_blocks > 0: the layers in window_layers hold that many blocks (the window pool)."""
        self.xp = xp
        self.window_layers = frozenset(window_layers) if window_blocks > 0 else frozenset()
        full = [i for i in range(num_layers) if i not in self.window_layers]
        # layer -> its index in its pool's array
        self._slot = {layer: i for pool in (full, sorted(self.window_layers)) for i, layer in enumerate(pool)}
        row = (block_size, kv_heads, head_dim)
        self.data = xp.zeros((len(full), 2, num_blocks, *row), dtype=storage.dtype)
        self.window_data = xp.zeros((len(self.window_layers), 2, window_blocks, *row), dtype=storage.dtype)

    @property
    def block_size(self) -> int:
        return int(self.data.shape[3])

    @property
    def num_blocks(self) -> int:
        return int(self.data.shape[2])

    def check_window_inputs(self, batch: StepBatch) -> None:
        """A step brings the window pool's tables and slots exactly when the cache has that pool: a scheduler bug
        otherwise, which would read and write the sliding layers' K/V in the wrong pool."""
        pool, copies = bool(self.window_layers), bool(batch.window_block_copies)
        tables, slots = batch.window_tables is not None, batch.window_slots is not None
        if (tables, slots) != (pool, pool) or (copies and not pool):
            given = zip(("window_tables", "window_slots", "window_block_copies"), (tables, slots, copies), strict=True)
            brings = ", ".join(name for name, there in given if there) or "no window tables or slots"
            raise BackendError(f"the KV cache has {'a' if pool else 'no'} window pool, but the step brings {brings}")

    def in_window_pool(self, layer: int) -> bool:
        return layer in self.window_layers

    def keys(self, layer: int) -> Any:
        return self._pool(layer)[self._slot[layer], 0]

    def values(self, layer: int) -> Any:
        return self._pool(layer)[self._slot[layer], 1]

    def _pool(self, layer: int) -> Any:
        return self.window_data if layer in self.window_layers else self.data

    def copy_blocks(self, pairs: Sequence[tuple[int, int]], window_pairs: Sequence[tuple[int, int]] = ()) -> None:
        """Copy-on-write: block dst becomes a copy of block src, by `pairs` in every layer of the full pool, by
        `window_pairs` in every layer of the window pool (one transfer of the pairs each)."""
        if window_pairs and not self.window_layers:
            raise ValueError("window block copies for a KV cache without a window pool")
        for pool, moves in ((self.data, pairs), (self.window_data, window_pairs)):
            if moves:
                index = self.xp.asarray(np.array(moves, dtype=np.int64).T)
                pool[:, :, index[1]] = pool[:, :, index[0]]
