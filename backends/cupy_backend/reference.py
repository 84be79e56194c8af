"""NumPy references for the CUDA kernels in `kernels/`: the specification each kernel is checked against.

Plain float64 math on float arrays (callers widen float16 / bfloat16 storage first). Functions return new arrays; the
in-place kernels (rope_and_cache: `rope` of q and of k, then `reshape_and_cache` of the rotated k and of v;
fused_add_rms_norm's residual) are described by what their outputs must equal. Shapes: K/V caches (num_blocks,
block_size, num_kv_heads, head_dim); q (tokens, num_heads, head_dim); block_tables (seqs, max_blocks) int;
context_lens (seqs,) counting this step's tokens; `window` > 0: a sliding layer's, each query attending to the last
`window` positions up to its own (0: the whole context). The dequantizing kernels' reference is gguf's own NumPy
dequantization (QuantMatrix.dequantize) followed by `linear`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
Ints = npt.NDArray[np.integer]
Floats = npt.NDArray[np.floating]


def reshape_and_cache(
    key: Floats, value: Floats, k_cache: Floats, v_cache: Floats, slot_mapping: Ints
) -> tuple[F64, F64]:
    """The caches after writing token t's K/V rows (kv_heads, head_dim) at slot_mapping[t]; slot < 0: skip."""
    out = []
    keep = slot_mapping >= 0
    for rows, cache in ((key, k_cache), (value, v_cache)):
        flat = np.array(cache, dtype=np.float64).reshape(-1, *cache.shape[2:])
        flat[slot_mapping[keep]] = rows[keep]
        out.append(flat.reshape(cache.shape))
    return out[0], out[1]


def window_start(last: int, window: int) -> int:
    """The first position a query at position `last` sees."""
    return max(0, last + 1 - window) if window > 0 else 0


def gather_context(cache: Floats, block_table_row: Ints, context_len: int, start: int = 0) -> F64:
    """Positions start..context_len-1 of one sequence, (context_len - start, kv_heads, head_dim)."""
    pos = np.arange(start, context_len)
    block_size = cache.shape[1]
    return np.asarray(cache[block_table_row[pos // block_size], pos % block_size], dtype=np.float64)


def _attend(q: Floats, keys: F64, values: F64, visible: npt.NDArray[np.bool_], scale: float) -> F64:
    """Softmax attention of q (n, heads, d) over keys/values (ctx, kv_heads, d); visible (n, ctx)."""
    group = q.shape[1] // keys.shape[1]
    k = np.repeat(keys, group, axis=1)  # query head h reads kv head h // group
    v = np.repeat(values, group, axis=1)
    scores = np.einsum("nhd,chd->nhc", np.asarray(q, dtype=np.float64), k) * scale
    scores = np.where(visible[:, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("nhc,chd->nhd", weights, v)


def paged_attention_decode(
    q: Floats, k_cache: Floats, v_cache: Floats, block_tables: Ints, context_lens: Ints, scale: float,
    window: int = 0,
) -> F64:
    """One query per sequence, q (seqs, heads, d), over its context (or window). Empty context: zeros."""
    out = np.zeros(q.shape, dtype=np.float64)
    for b, ctx in enumerate(int(c) for c in context_lens):
        if ctx > 0:
            lo = window_start(ctx - 1, window)
            keys = gather_context(k_cache, block_tables[b], ctx, lo)
            values = gather_context(v_cache, block_tables[b], ctx, lo)
            out[b] = _attend(q[b : b + 1], keys, values, np.ones((1, ctx - lo), bool), scale)[0]
    return out


def paged_attention_partials(
    q: Floats,
    k_cache: Floats,
    v_cache: Floats,
    block_tables: Ints,
    context_lens: Ints,
    scale: float,
    partition_size: int,
    max_partitions: int,
    window: int = 0,
) -> tuple[F64, F64, F64]:
    """(exp_sums, max_logits, tmp_out) of the partitioned decode kernel: per (seq, head, partition) the max
    score, sum of exp(score - max) and normalised output over that partition's positions, partitions counted
    from the window's first position. Partitions past a sequence's context are left 0 (the kernel leaves them
    unwritten)."""
    seqs, heads, d = q.shape
    exp_sums = np.zeros((seqs, heads, max_partitions))
    max_logits = np.zeros((seqs, heads, max_partitions))
    tmp_out = np.zeros((seqs, heads, max_partitions, d))
    for b, ctx in enumerate(int(c) for c in context_lens):
        group, lo = heads // k_cache.shape[2], window_start(ctx - 1, window)
        keys = np.repeat(gather_context(k_cache, block_tables[b], ctx, lo), group, axis=1)
        values = np.repeat(gather_context(v_cache, block_tables[b], ctx, lo), group, axis=1)
        for p, start in enumerate(range(0, ctx - lo, partition_size)):
            k, v = keys[start : start + partition_size], values[start : start + partition_size]
            scores = np.einsum("hd,chd->hc", np.asarray(q[b], dtype=np.float64), k) * scale
            max_logits[b, :, p] = scores.max(axis=1)
            weights = np.exp(scores - max_logits[b, :, p, None])
            exp_sums[b, :, p] = weights.sum(axis=1)
            tmp_out[b, :, p] = np.einsum("hc,chd->hd", weights, v) / exp_sums[b, :, p, None]
    return exp_sums, max_logits, tmp_out


def paged_attention_reduce(
    exp_sums: Floats, max_logits: Floats, tmp_out: Floats, context_lens: Ints, partition_size: int,
    window: int = 0,
) -> F64:
    """Merges partials into (seqs, heads, d), reading only the partitions that cover each context's window."""
    seqs, heads, _, d = tmp_out.shape
    out = np.zeros((seqs, heads, d))
    for b, ctx in enumerate(int(c) for c in context_lens):
        n = -(-(ctx - window_start(ctx - 1, window)) // partition_size)
        if n == 0:
            continue
        m = np.asarray(max_logits[b, :, :n], dtype=np.float64)
        w = exp_sums[b, :, :n] * np.exp(m - m.max(axis=1, keepdims=True))
        out[b] = np.einsum("hp,hpd->hd", w, tmp_out[b, :, :n]) / w.sum(axis=1, keepdims=True)
    return out


def paged_prefill_attention(
    q: Floats,
    k_cache: Floats,
    v_cache: Floats,
    block_tables: Ints,
    context_lens: Ints,
    query_start: Ints,
    scale: float,
    window: int = 0,
) -> F64:
    """Flattened chunks q (tokens, heads, d): seq b's rows query_start[b]:query_start[b+1] are the last q_len
    positions of its context; row j (position p = ctx - q_len + j) sees positions window_start(p)..p. Nothing
    before the first row's window is read."""
    out = np.zeros(q.shape, dtype=np.float64)
    for b, ctx in enumerate(int(c) for c in context_lens):
        lo, hi = int(query_start[b]), int(query_start[b + 1])
        if hi == lo:
            continue
        positions = ctx - (hi - lo) + np.arange(hi - lo)
        first = window_start(int(positions[0]), window)
        keys_at = np.arange(first, ctx)[None, :]
        starts = np.array([window_start(int(p), window) for p in positions])
        visible = (keys_at <= positions[:, None]) & (keys_at >= starts[:, None])
        keys = gather_context(k_cache, block_tables[b], ctx, first)
        values = gather_context(v_cache, block_tables[b], ctx, first)
        out[lo:hi] = _attend(q[lo:hi], keys, values, visible, scale)
    return out


def rms_norm(x: Floats, weight: Floats, eps: float) -> F64:
    """Rows of x divided by their root mean square (plus eps under the root), times weight."""
    x64 = np.asarray(x, dtype=np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * weight


def fused_add_rms_norm(x: Floats, residual: Floats, weight: Floats, eps: float) -> tuple[F64, F64]:
    """(rms_norm(x + residual), x + residual): the kernel stores the sum into `residual` and normalises it."""
    total = np.asarray(x, dtype=np.float64) + residual
    return rms_norm(total, weight, eps), total


def rope_cos_sin_cache(max_position: int, rot_dim: int, theta: float,
                       factors: Sequence[float] = ()) -> npt.NDArray[np.float32]:
    """(max_position, rot_dim) float32: row p is cos(p * f_i) for i < rot_dim / 2, then sin(p * f_i), with
    f_i = theta ** (-2 i / rot_dim) / factors[i] (Llama 3's RoPE scaling; no factors: 1). Angles in float64, so
    large positions stay exact."""
    freqs = theta ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    if len(factors):
        freqs = freqs / np.asarray(factors, dtype=np.float64)
    angles = np.arange(max_position, dtype=np.float64)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def rope(positions: Ints, x: Floats, cos_sin_cache: Floats, halves: bool = False) -> F64:
    """x (tokens, heads, head_dim) with pair i < rot_dim / 2 rotated by its angle at the token's position: the
    interleaved pairs (2i, 2i+1), or with `halves` NeoX's (i, i + rot_dim / 2); the rest of each head unchanged.
    Apply to q and to k."""
    rot_dim = cos_sin_cache.shape[1]
    out = np.array(x, dtype=np.float64)
    cs = np.asarray(cos_sin_cache[positions], dtype=np.float64)[:, None, :]
    cos, sin = cs[..., : rot_dim // 2], cs[..., rot_dim // 2 :]
    first, second = (slice(0, rot_dim // 2), slice(rot_dim // 2, rot_dim)) if halves else (
        slice(0, rot_dim, 2), slice(1, rot_dim, 2))
    x0, x1 = out[..., first].copy(), out[..., second].copy()
    out[..., first] = x0 * cos - x1 * sin
    out[..., second] = x0 * sin + x1 * cos
    return out


def rope_from_theta(positions: Ints, x: Floats, theta: float) -> F64:
    """The rotation straight from its definition (whole head, theta_i = pos * theta^(-2i/head_dim))."""
    head_dim = x.shape[-1]
    freqs = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None, None] * freqs
    x0, x1 = np.asarray(x[..., 0::2], np.float64), np.asarray(x[..., 1::2], np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    out[..., 0::2] = x0 * np.cos(angles) - x1 * np.sin(angles)
    out[..., 1::2] = x0 * np.sin(angles) + x1 * np.cos(angles)
    return out


def silu_mul(x: Floats) -> F64:
    """Rows [gate | up] of width 2F -> silu(gate) * up, width F."""
    x64 = np.asarray(x, dtype=np.float64)
    gate, up = np.split(x64, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


def gelu_tanh_mul(x: Floats) -> F64:
    """Rows [gate | up] of width 2F -> gelu_tanh(gate) * up, width F (GELU's tanh approximation)."""
    gate, up = np.split(np.asarray(x, dtype=np.float64), 2, axis=-1)
    return 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3))) * up


def head_rms_norm(qk: Floats, q_weight: Floats, k_weight: Floats, num_heads: int, eps: float) -> F64:
    """QK norm: qk (tokens, heads + kv_heads, head_dim), each head normalised with the Q or the K weight."""
    weights = np.where((np.arange(qk.shape[1]) < num_heads)[:, None], q_weight, k_weight)
    return rms_norm(qk, weights, eps)


def linear(x: Floats, w: Floats) -> F64:
    """x (M, K) @ w.T with w (N, K) as the weights are stored: every projection of the forward."""
    return np.asarray(x, dtype=np.float64) @ np.asarray(w, dtype=np.float64).T
