"""The NumPy references agree with independent formulations of the same math, so the kernels are checked
against the intended semantics (no compilers needed)."""

from __future__ import annotations

import numpy as np

from backends.cupy_backend import reference
from backends.numpy_backend.attention import decode_attention, prefill_attention
from backends.numpy_backend.layers import RopeTable, gelu_tanh_mul, rms_norm, rotate_halves
from tests.cuda.dtypes import FLOAT32
from tests.cuda.emu_data import make_paged_kv


def _dense_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, first_pos: int, scale: float) -> np.ndarray:
    """Plain loops: query i (position first_pos + i) over keys 0..first_pos + i, kv head h // group."""
    group = q.shape[1] // k.shape[1]
    out = np.zeros(q.shape)
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys = k[: first_pos + i + 1, h // group]
            s = keys @ q[i, h] * scale
            w = np.exp(s - s.max())
            out[i, h] = w @ v[: first_pos + i + 1, h // group] / w.sum()
    return out


def test_prefill_reference_is_causal_attention_over_prefix_and_chunk() -> None:
    rng = np.random.default_rng(1)
    prefix, chunk, heads, kv_heads, d = [9, 0], [6, 4], 6, 2, 8
    kv = make_paged_kv(rng, FLOAT32, [p + c for p, c in zip(prefix, chunk, strict=True)], kv_heads, d, 4)
    query_start = np.array([0, 6, 10], np.int32)
    q = rng.standard_normal((10, heads, d))
    got = reference.paged_prefill_attention(
        q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, query_start, 0.3
    )
    for b in range(2):
        ctx = int(kv.context_lens[b])
        k = reference.gather_context(kv.k_values, kv.block_tables[b], ctx)
        v = reference.gather_context(kv.v_values, kv.block_tables[b], ctx)
        lo, hi = query_start[b], query_start[b + 1]
        np.testing.assert_allclose(got[lo:hi], _dense_causal(q[lo:hi], k, v, prefix[b], 0.3), rtol=1e-12)


def test_decode_is_prefill_with_one_query() -> None:
    rng = np.random.default_rng(2)
    kv = make_paged_kv(rng, FLOAT32, [5, 21, 1], 1, 8, 4)
    q = rng.standard_normal((3, 4, 8))
    decode = reference.paged_attention_decode(q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, 0.5)
    prefill = reference.paged_prefill_attention(
        q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, np.arange(4, dtype=np.int32), 0.5
    )
    np.testing.assert_allclose(decode, prefill, rtol=1e-12)


def test_partials_reduce_to_decode() -> None:
    rng = np.random.default_rng(3)
    kv = make_paged_kv(rng, FLOAT32, [23, 7, 0], 2, 8, 4)
    q = rng.standard_normal((3, 4, 8))
    args = (q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, 0.5)
    sums, maxes, outs = reference.paged_attention_partials(*args, partition_size=5, max_partitions=5)
    merged = reference.paged_attention_reduce(sums, maxes, outs, kv.context_lens, 5)
    np.testing.assert_allclose(merged, reference.paged_attention_decode(*args), rtol=1e-12, atol=1e-15)


def test_rope_cache_matches_the_theta_formula() -> None:
    rng = np.random.default_rng(4)
    positions = np.array([0, 1, 17, 4095], np.int32)
    x = rng.standard_normal((4, 3, 64))
    cache = reference.rope_cos_sin_cache(4096, 64, 10000.0)
    # the cache's cos and sin are float64 values rounded once to float32 (at most 2^-25 below 1), so a rotated pair's
    # x0 * cos - x1 * sin moves by (|x0| + |x1|) * 2^-25 <= 2^-24 * max|x|; 2x (measured 8.6e-8, max|x| 3.2)
    np.testing.assert_allclose(
        reference.rope(positions, x, cache),
        reference.rope_from_theta(positions, x, 10000.0),
        rtol=0,
        atol=2.0**-23 * np.abs(x).max(),
    )


def test_rope_rotates_interleaved_pairs() -> None:
    """Pair (0, 1) of a head at position 1 with theta_0 = 1 rad: (1, 0) -> (cos 1, sin 1)."""
    x = np.zeros((1, 1, 4))
    x[0, 0, 0] = 1.0
    out = reference.rope_from_theta(np.array([1]), x, 10000.0)
    np.testing.assert_allclose(out[0, 0, :2], [np.cos(1.0), np.sin(1.0)])


def test_norms_and_activation() -> None:
    x = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(
        reference.rms_norm(x, np.array([1.0, 2.0]), 0.0), [[3 / np.sqrt(12.5), 8 / np.sqrt(12.5)]]
    )
    out, total = reference.fused_add_rms_norm(x, -x + 1.0, np.ones(2), 0.0)
    np.testing.assert_allclose(total, [[1.0, 1.0]])
    np.testing.assert_allclose(out, [[1.0, 1.0]])
    np.testing.assert_allclose(reference.silu_mul(np.array([[0.0, 2.0, 5.0, 3.0]])), [[0.0, 2 / (1 + np.exp(-2)) * 3]])


def test_reshape_and_cache_skips_negative_slots() -> None:
    cache = np.zeros((2, 2, 1, 1))
    key = np.array([[[1.0]], [[2.0]], [[3.0]]])
    k, _ = reference.reshape_and_cache(key, key, cache, cache, np.array([3, -1, 0]))
    np.testing.assert_array_equal(k.reshape(-1), [3.0, 0.0, 0.0, 1.0])


def test_windowed_references_match_the_numpy_backends_attention() -> None:
    """A sliding layer's decode, partitioned decode and prefill references compute what the NumPy backend's
    attention does with the same window (its own float32 implementation), over a context longer than it."""
    rng = np.random.default_rng(5)
    window, scale = 6, 8**-0.5
    kv = make_paged_kv(rng, FLOAT32, [23, 4, 15], 2, 8, 4)
    # the NumPy backend's caches hold zeros where nothing was written (it weighs them by an exact 0), not NaN
    k32, v32 = (np.nan_to_num(c).astype(np.float32) for c in (kv.k_values, kv.v_values))
    q = rng.standard_normal((3, 4, 8))
    args = (q, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens, scale)
    decode = reference.paged_attention_decode(*args, window)
    want = decode_attention(q.astype(np.float32), k32, v32, kv.block_tables, kv.context_lens, window)
    np.testing.assert_allclose(decode, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(decode, reference.paged_attention_decode(*args)), "the window changes nothing here"
    sums, maxes, outs = reference.paged_attention_partials(*args, partition_size=4, max_partitions=6, window=window)
    merged = reference.paged_attention_reduce(sums, maxes, outs, kv.context_lens, 4, window)
    np.testing.assert_allclose(merged, decode, rtol=1e-12, atol=1e-15)
    query_start, chunk = np.array([0, 9, 10, 15], np.int32), rng.standard_normal((15, 4, 8))
    prefill = reference.paged_prefill_attention(chunk, kv.k_values, kv.v_values, kv.block_tables, kv.context_lens,
                                                query_start, scale, window)
    for b in range(3):
        lo, hi = query_start[b], query_start[b + 1]
        want = prefill_attention(chunk[lo:hi].astype(np.float32), k32, v32, kv.block_tables[b],
                                 int(kv.context_lens[b]), window)
        np.testing.assert_allclose(prefill[lo:hi], want, rtol=1e-4, atol=1e-5)


def test_rope_halves_and_factors_match_the_numpy_forward() -> None:
    """NeoX's pairs and Llama 3's frequency factors: the table and the rotation the NumPy forward uses."""
    rng = np.random.default_rng(6)
    positions, x = np.array([0, 3, 250], np.int32), rng.standard_normal((3, 2, 16))
    factors = tuple(float(f) for f in np.linspace(1.0, 8.0, 8))
    cache = reference.rope_cos_sin_cache(256, 16, 1e6, factors)
    table = RopeTable.build(16, 1e6, 256, factors)
    np.testing.assert_array_equal(cache, np.concatenate([table.cos, table.sin], axis=1))
    cos, sin = table.at(positions)
    want = rotate_halves(x.astype(np.float32), cos, sin)
    np.testing.assert_allclose(reference.rope(positions, x, cache, halves=True), want, rtol=1e-5, atol=1e-6)


def test_gelu_and_qk_norm_match_the_numpy_forward() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 40)).astype(np.float32) * 3
    np.testing.assert_allclose(reference.gelu_tanh_mul(x), gelu_tanh_mul(x), rtol=1e-5, atol=1e-6)
    qk, q_w, k_w = rng.standard_normal((2, 5, 8)), rng.standard_normal(8), rng.standard_normal(8)
    want = np.concatenate([rms_norm(qk[:, :3], q_w, 1e-6), rms_norm(qk[:, 3:], k_w, 1e-6)], axis=1)
    np.testing.assert_allclose(reference.head_rms_norm(qk, q_w, k_w, 3, 1e-6), want, rtol=1e-12)
