"""Test inputs for the emulated kernels: paged KV caches with shuffled block tables, fused QKV buffers, and the
comparison helper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tests.cuda.dtypes import DType

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]


@dataclass(frozen=True)
class PagedKV:
    k_cache: npt.NDArray[np.generic]  # storage dtype, what the kernel reads
    v_cache: npt.NDArray[np.generic]
    k_values: F64  # the same caches decoded, for the reference
    v_values: F64
    block_tables: I32
    context_lens: I32

    @property
    def block_size(self) -> int:
        return int(self.k_cache.shape[1])

    @property
    def max_blocks(self) -> int:
        return int(self.block_tables.shape[1])


def make_paged_kv(
    rng: np.random.Generator, dt: DType, context_lens: Sequence[int], kv_heads: int, head_dim: int, block_size: int,
    unread: Sequence[int] = (),
) -> PagedKV:
    """Caches where every position outside a sequence's context is NaN, so any read past a context, from a
    padded block table entry (block 0, never allocated) or from a spare block poisons the output. unread[b]:
    sequence b's positions before it are NaN too, and its blocks wholly before it are block 0 in the table (a
    sliding window's, whose blocks a window pool gives back)."""
    need = [-(-c // block_size) for c in context_lens]
    num_blocks = 1 + sum(need) + 2
    physical = rng.permutation(np.arange(1, num_blocks)).astype(np.int32)
    tables = np.zeros((len(context_lens), max(need) + 1), dtype=np.int32)
    caches = [np.full((num_blocks, block_size, kv_heads, head_dim), np.nan, np.float32) for _ in range(2)]
    used = 0
    for b, ctx in enumerate(context_lens):
        tables[b, : need[b]] = physical[used : used + need[b]]
        used += need[b]
        pos = np.arange(ctx)
        for cache in caches:
            cache[tables[b, pos // block_size], pos % block_size] = rng.standard_normal((ctx, kv_heads, head_dim))
    for b, lo in enumerate(unread):
        pos = np.arange(lo)
        for cache in caches:
            cache[tables[b, pos // block_size], pos % block_size] = np.nan
        tables[b, : lo // block_size] = 0
    k, v = (dt.encode(c) for c in caches)
    return PagedKV(k, v, dt.decode(k), dt.decode(v), tables, np.asarray(context_lens, dtype=np.int32))


def make_qkv(
    rng: np.random.Generator, dt: DType, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> npt.NDArray[np.generic]:
    """A fused (tokens, (heads + 2 kv_heads) * head_dim) projection output; q/k/v are strided views of it."""
    return dt.encode(rng.standard_normal((tokens, (heads + 2 * kv_heads) * head_dim)))


def flat_from(a: npt.NDArray[np.generic], offset: int) -> npt.NDArray[np.generic]:
    """A contiguous 1-D view starting `offset` elements into `a`: how a kernel gets a strided sub-tensor."""
    return a.reshape(-1)[offset:]


def nan_like(dt: DType, shape: tuple[int, ...]) -> npt.NDArray[np.generic]:
    """An output buffer of NaNs, so elements a kernel forgot to write fail the comparison."""
    return dt.encode(np.full(shape, np.nan, np.float32))


def assert_close(actual: F64, expected: F64, atol: float, rtol: float, what: str) -> None:
    err = np.abs(actual - expected)
    bad = ~(err <= atol + rtol * np.abs(expected))  # NaN counts as bad
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.size} elements off; first at {idx}: got {actual[idx]!r}, "
            f"expected {expected[idx]!r} (atol {atol}, rtol {rtol}); max err {np.nanmax(err):.3g}"
        )
    print(f"{what}: max abs err {float(err.max()) if err.size else 0.0:.3g}")
