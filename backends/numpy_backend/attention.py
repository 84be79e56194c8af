"""Attention over the paged KV cache.

Decode tokens (one query per sequence) are attended in one vectorised pass over the whole batch: every
sequence's blocks are gathered into a padded (B, L) context and masked past its length. That is the
reference: the backend normally runs the C kernel in native/paged_attention.c, which reads the blocks in
place. Prefill chunks, at most a few per step, are attended one sequence at a time with a causal mask offset
by the cached prefix (BLAS matmuls); that too is the reference for the C chunk kernel in
native/chunk_attention.h, which gathers the sequence's blocks and attends tiles of query tokens. A sliding
layer's query attends to the last `window` positions up to its own only, in these references and in the C
kernels alike: paged_attention hands the layer's window to whichever it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# (q, k_cache, v_cache, block_tables, context_lens, window) -> out: decode_attention below, or the C kernel's
# binding
DecodeAttention = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
# (q, k_cache, v_cache, block_table, context_len, window) -> out for one sequence's chunk: prefill_attention
# below, or the C kernel's binding
ChunkAttention = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int], np.ndarray]

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class AttentionLayout:
    """Which tokens of a step are decode tokens and which belong to prefill chunks; fixed for all layers."""

    decode_rows: np.ndarray  # token index of each decode sequence's query
    decode_seqs: np.ndarray  # sequence index (into the batch) of each decode query
    prefill_seqs: tuple[int, ...]  # sequence indices with more than one query token
    all_decode: bool  # every sequence has exactly one query token: rows, sequences and tables line up

    @classmethod
    def of(cls, query_start: np.ndarray) -> AttentionLayout:
        q_lens = np.diff(query_start)
        decode = np.flatnonzero(q_lens == 1)
        prefill = tuple(int(b) for b in np.flatnonzero(q_lens > 1))
        return cls(query_start[decode].astype(np.int64), decode, prefill, len(decode) == len(q_lens))


def _softmax_weighted(scores: np.ndarray, values: np.ndarray) -> np.ndarray:
    """softmax(scores) @ values along the last axis of scores; float32 throughout."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, values)


def decode_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                     context_lens: np.ndarray, window: int = 0) -> np.ndarray:
    """q (B, heads, d) for one token per sequence -> (B, heads, d); window > 0: over the last `window`
    positions only."""
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_blocks = -(-int(context_lens.max()) // block_size)
    tables = block_tables[:, :num_blocks]  # -1 (a window pool's block given back) gathers the last block: masked
    keys = k_cache[tables].reshape(batch, -1, kv_heads, dim).transpose(0, 2, 3, 1)  # (B, kvh, d, L)
    values = v_cache[tables].reshape(batch, -1, kv_heads, dim).transpose(0, 2, 1, 3)  # (B, kvh, L, d)
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dim) * np.float32(dim**-0.5)
    scores = np.matmul(grouped, keys)  # (B, kvh, group, L)
    positions = np.arange(keys.shape[-1])[None, :]
    outside = positions >= context_lens[:, None]  # (B, L)
    if window:
        outside |= positions < context_lens[:, None] - window
    # replaced, not added to: a position outside may hold any block's keys (a -1 entry's, or padding's), which
    # must not reach the softmax, not even as inf or NaN; its value rows (finite: the cache holds zeros or stored
    # K/V) are weighed by an exact 0
    np.copyto(scores, NEG_INF, where=outside[:, None, None, :])
    return _softmax_weighted(scores, values).reshape(batch, heads, dim)


def prefill_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_table: np.ndarray,
                      context_len: int, window: int = 0) -> np.ndarray:
    """One sequence's chunk q (n, heads, d), the last n of its context_len positions -> (n, heads, d); window
    > 0: each query over the last `window` positions up to its own."""
    n, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    # a -1 entry (a window pool's block given back, wholly before the window) gathers the last block: its scores
    # are replaced below (hidden), so what that block holds never reaches the softmax
    tables = block_table[: -(-context_len // block_size)]
    keys = k_cache[tables].reshape(-1, kv_heads, dim)[:context_len]
    values = v_cache[tables].reshape(-1, kv_heads, dim)[:context_len]
    group = heads // kv_heads
    grouped = q.reshape(n, kv_heads, group, dim).transpose(1, 2, 0, 3) * np.float32(dim**-0.5)
    scores = np.matmul(grouped, keys.transpose(1, 2, 0)[:, None])  # (kvh, group, n, ctx)
    query_pos, key_pos = np.arange(context_len - n, context_len)[:, None], np.arange(context_len)[None, :]
    hidden = key_pos > query_pos
    if window:
        hidden |= key_pos <= query_pos - window
    scores[..., hidden] = NEG_INF
    out = _softmax_weighted(scores, values.transpose(1, 0, 2)[:, None])  # (kvh, group, n, d)
    return out.transpose(2, 0, 1, 3).reshape(n, heads, dim)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, layout: AttentionLayout,
                    query_start: np.ndarray, block_tables: np.ndarray, context_lens: np.ndarray,
                    decode: DecodeAttention = decode_attention,
                    chunk: ChunkAttention = prefill_attention, window: int = 0) -> np.ndarray:
    """Attention for every query token of a step, q (T, heads, d) -> (T, heads, d); window > 0: a sliding
    layer's."""
    if layout.all_decode:  # the common step: no row gathering
        return decode(q, k_cache, v_cache, block_tables, context_lens, window)
    out = np.empty_like(q)
    if layout.decode_rows.size:
        seqs = layout.decode_seqs
        out[layout.decode_rows] = decode(
            q[layout.decode_rows], k_cache, v_cache, block_tables[seqs], context_lens[seqs], window
        )
    for b in layout.prefill_seqs:
        rows = slice(int(query_start[b]), int(query_start[b + 1]))
        out[rows] = chunk(q[rows], k_cache, v_cache, block_tables[b], int(context_lens[b]), window)
    return out
