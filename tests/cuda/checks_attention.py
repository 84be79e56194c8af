"""Emulated attention kernels against the NumPy reference: decode (plain and partitioned + reduce) and
chunked prefill, over shuffled block tables with NaN everywhere a kernel must not read; with a window (a sliding
layer's), also at every position before the window and in the blocks wholly before it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backends.cupy_backend import launch, reference
from tests.cuda.dtypes import DType
from tests.cuda.emu_data import PagedKV, assert_close, make_paged_kv, make_qkv, nan_like
from tests.cuda.emu_lib import Arg, EmuLib

# Partials are float32 whatever the storage dtype: compared at float32-with-exp accuracy.
PARTIAL_ATOL, PARTIAL_RTOL = 1e-5, 1e-4


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int = 64
    block_size: int = 16
    window: int = 0  # > 0: a sliding layer's


def _decode_unread(s: Shape, context_lens: Sequence[int]) -> list[int]:
    """Each sequence's first position its decode query sees: nothing before it may be read."""
    return [reference.window_start(c - 1, s.window) for c in context_lens]


def _q_views(rng: np.random.Generator, dt: DType, tokens: int, s: Shape) -> tuple[np.ndarray, np.ndarray, int]:
    """(qkv buffer, decoded q (tokens, heads, d), q_stride): q is read as a strided view of a fused QKV."""
    qkv = make_qkv(rng, dt, tokens, s.heads, s.kv_heads, s.head_dim)
    q = dt.decode(qkv)[:, : s.heads * s.head_dim].reshape(tokens, s.heads, s.head_dim)
    return qkv, q, qkv.shape[1]


def _kv_args(kv: PagedKV) -> list[Arg]:
    return [kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens]


def check_decode(lib: EmuLib, dt: DType, s: Shape, context_lens: Sequence[int], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    kv = make_paged_kv(rng, dt, context_lens, s.kv_heads, s.head_dim, s.block_size, _decode_unread(s, context_lens))
    seqs = len(context_lens)
    qkv, q, q_stride = _q_views(rng, dt, seqs, s)
    scale = 1.0 / math.sqrt(s.head_dim)
    out = nan_like(dt, (seqs, s.heads, s.head_dim))
    spec = launch.paged_attention_decode(dt.name, s.head_dim, seqs, s.heads, s.kv_heads, s.block_size)
    lib.launch(spec, [out, qkv, *_kv_args(kv), scale, s.kv_heads, kv.max_blocks, s.block_size, q_stride, s.window])
    expected = reference.paged_attention_decode(q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, scale,
                                                s.window)
    assert_close(dt.decode(out), expected, dt.atol, dt.rtol, f"{spec.name} window {s.window}")


def check_decode_partitioned(
    lib: EmuLib, dt: DType, s: Shape, context_lens: Sequence[int], partition_size: int, seed: int = 0
) -> None:
    rng = np.random.default_rng(seed)
    kv = make_paged_kv(rng, dt, context_lens, s.kv_heads, s.head_dim, s.block_size, _decode_unread(s, context_lens))
    seqs = len(context_lens)
    qkv, q, q_stride = _q_views(rng, dt, seqs, s)
    scale = 1.0 / math.sqrt(s.head_dim)
    spec = launch.paged_attention_decode_partitioned(
        dt.name, s.head_dim, seqs, s.heads, s.kv_heads, max(context_lens), partition_size, s.window, s.block_size
    )
    parts = spec.grid[2]
    assert parts >= 2, "a partitioned case must span several partitions"
    exp_sums, max_logits = (np.full((seqs, s.heads, parts), np.nan, np.float32) for _ in range(2))
    tmp_out = np.full((seqs, s.heads, parts, s.head_dim), np.nan, np.float32)
    args: list[Arg] = [exp_sums, max_logits, tmp_out, qkv, *_kv_args(kv), scale, s.kv_heads, kv.max_blocks]
    lib.launch(spec, [*args, s.block_size, q_stride, partition_size, s.window])
    _check_partials(kv, q, scale, partition_size, (exp_sums, max_logits, tmp_out), spec.name, s.window)

    out = nan_like(dt, (seqs, s.heads, s.head_dim))
    reduce = launch.paged_attention_reduce(dt.name, s.head_dim, seqs, s.heads)
    lib.launch(reduce, [out, exp_sums, max_logits, tmp_out, kv.context_lens, parts, partition_size, s.window])
    expected = reference.paged_attention_decode(q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, scale,
                                                s.window)
    assert_close(dt.decode(out), expected, dt.atol, dt.rtol, f"{reduce.name} window {s.window}")


def _check_partials(
    kv: PagedKV, q: np.ndarray, scale: float, partition_size: int, got: tuple[np.ndarray, ...], name: str,
    window: int,
) -> None:
    parts = got[0].shape[2]
    want = reference.paged_attention_partials(
        q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, scale, partition_size, parts, window
    )
    for b, ctx in enumerate(int(c) for c in kv.context_lens):
        n = -(-(ctx - reference.window_start(ctx - 1, window)) // partition_size)  # later ones stay unwritten
        for label, g, w in zip(("exp_sums", "max_logits", "tmp_out"), got, want, strict=True):
            assert_close(g[b, :, :n].astype(np.float64), w[b, :, :n], PARTIAL_ATOL, PARTIAL_RTOL, f"{name} {label}")


def check_prefill(
    lib: EmuLib, dt: DType, s: Shape, prefix_lens: Sequence[int], query_lens: Sequence[int], seed: int = 0
) -> None:
    """Chunks of query_lens[b] new tokens after prefix_lens[b] cached ones (their K/V already cached)."""
    rng = np.random.default_rng(seed)
    context_lens = [p + n for p, n in zip(prefix_lens, query_lens, strict=True)]
    unread = [reference.window_start(p, s.window) for p in prefix_lens]  # the first query's window
    kv = make_paged_kv(rng, dt, context_lens, s.kv_heads, s.head_dim, s.block_size, unread)
    query_start = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    tokens = int(query_start[-1])
    qkv, q, q_stride = _q_views(rng, dt, tokens, s)
    scale = 1.0 / math.sqrt(s.head_dim)
    out = nan_like(dt, (tokens, s.heads, s.head_dim))
    spec = launch.paged_prefill_attention(dt.name, s.head_dim, len(query_lens), s.heads, s.kv_heads, max(query_lens))
    args: list[Arg] = [out, qkv, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, query_start, scale]
    lib.launch(spec, [*args, s.kv_heads, kv.max_blocks, s.block_size, q_stride, s.window])
    expected = reference.paged_prefill_attention(
        q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, query_start, scale, s.window
    )
    assert_close(dt.decode(out), expected, dt.atol, dt.rtol, f"{spec.name} window {s.window}")
