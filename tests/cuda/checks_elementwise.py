"""Emulated per-token kernels against the NumPy reference: RMSNorm (plain, fused with the residual add, and per
Q / K head inside the fused QKV rows), RoPE (interleaved and halves pairs) fused with the KV cache write, and the
gated activations (SiLU and GELU-tanh times up)."""

from __future__ import annotations

import numpy as np

from backends.cupy_backend import launch, reference
from tests.cuda.dtypes import DType
from tests.cuda.emu_data import assert_close, flat_from, make_qkv, nan_like
from tests.cuda.emu_lib import Arg, EmuLib

EPS = 1e-5
ROPE_THETA = 10000.0
MAX_POSITION = 4096


def check_rms_norm(lib: EmuLib, dt: DType, tokens: int = 5, hidden: int = 200, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = dt.encode(rng.standard_normal((tokens, hidden)) * 3.0)
    weight = dt.encode(1.0 + 0.1 * rng.standard_normal(hidden))
    expected = reference.rms_norm(dt.decode(x), dt.decode(weight), EPS)
    spec = launch.rms_norm(dt.name, tokens, hidden)
    out = nan_like(dt, x.shape)
    lib.launch(spec, [out, x, weight, EPS, hidden])
    assert_close(dt.decode(out), expected, dt.atol, dt.rtol, spec.name)
    lib.launch(spec, [x, x, weight, EPS, hidden])
    assert_close(dt.decode(x), expected, dt.atol, dt.rtol, f"{spec.name} in place")


def check_fused_add_rms_norm(lib: EmuLib, dt: DType, tokens: int = 5, hidden: int = 200, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x, residual = (dt.encode(rng.standard_normal((tokens, hidden))) for _ in range(2))
    weight = dt.encode(1.0 + 0.1 * rng.standard_normal(hidden))
    # The stored sum is the float32 sum rounded once to the storage dtype: exact.
    want_sum = dt.round_trip((dt.decode(x) + dt.decode(residual)).astype(np.float32))
    want_out = reference.fused_add_rms_norm(dt.decode(x), dt.decode(residual), dt.decode(weight), EPS)[0]
    spec = launch.fused_add_rms_norm(dt.name, tokens, hidden)
    out = nan_like(dt, x.shape)
    lib.launch(spec, [out, x, residual, weight, EPS, hidden])
    assert_close(dt.decode(residual), want_sum, 0.0, 0.0, f"{spec.name} residual")
    assert_close(dt.decode(out), want_out, dt.atol, dt.rtol, spec.name)


def check_head_rms_norm(lib: EmuLib, dt: DType, tokens: int = 5, head_dim: int = 256, seed: int = 0) -> None:
    """QK norm in place inside a fused QKV buffer: every Q head with the Q weight, every K head with the K
    weight; V left as it was."""
    heads, kv_heads = 3, 2
    rng = np.random.default_rng(seed)
    qkv = dt.encode(rng.standard_normal((tokens, (heads + 2 * kv_heads) * head_dim)) * 3.0)
    q_weight, k_weight = (dt.encode(1.0 + 0.1 * rng.standard_normal(head_dim)) for _ in range(2))
    before = dt.decode(qkv)
    qk_width = (heads + kv_heads) * head_dim
    expected = before.copy()
    normed = reference.head_rms_norm(before[:, :qk_width].reshape(tokens, heads + kv_heads, head_dim),
                                     dt.decode(q_weight), dt.decode(k_weight), heads, EPS)
    expected[:, :qk_width] = normed.reshape(tokens, -1)
    spec = launch.head_rms_norm(dt.name, tokens, heads, kv_heads)
    lib.launch(spec, [qkv, q_weight, k_weight, EPS, heads, head_dim, qkv.shape[1]])
    assert_close(dt.decode(qkv), expected, dt.atol, dt.rtol, f"{spec.name} head_dim {head_dim} (V untouched)")


def check_rope_and_cache(lib: EmuLib, dt: DType, rot_dim: int = 64, tokens: int = 9, seed: int = 0,
                         halves: bool = False, head_dim: int = 64) -> None:
    """q rotated in place inside a fused QKV buffer (strided views); each K row rotated into its cache slot and
    V copied beside it, at shuffled slots with two padding ones; the QKV rows' K and V left as they were. Pairs
    interleaved, or NeoX's halves."""
    heads, kv_heads, blocks, block_size = 6, 2, 6, 16
    rng = np.random.default_rng(seed)
    qkv = make_qkv(rng, dt, tokens, heads, kv_heads, head_dim)
    before = dt.decode(qkv)
    positions = rng.integers(0, MAX_POSITION, tokens).astype(np.int32)
    cache = reference.rope_cos_sin_cache(MAX_POSITION, rot_dim, ROPE_THETA)
    slots = rng.permutation(blocks * block_size)[:tokens].astype(np.int64)
    slots[[1, tokens - 2]] = -1
    shape = (blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = (dt.encode(rng.standard_normal(shape)) for _ in range(2))
    k_off, v_off = heads * head_dim, (heads + kv_heads) * head_dim
    expected = before.copy()
    expected[:, :k_off] = reference.rope(positions, before[:, :k_off].reshape(tokens, heads, -1),
                                         cache, halves).reshape(tokens, -1)
    k_rot = reference.rope(positions, before[:, k_off:v_off].reshape(tokens, kv_heads, -1), cache, halves)
    want_k, want_v = reference.reshape_and_cache(k_rot, before[:, v_off:].reshape(tokens, kv_heads, -1),
                                                 dt.decode(k_cache), dt.decode(v_cache), slots)
    spec = launch.rope_and_cache(dt.name, tokens, heads, kv_heads, head_dim, rot_dim)
    stride = qkv.shape[1]
    args: list[Arg] = [positions, flat_from(qkv, 0), flat_from(qkv, k_off), flat_from(qkv, v_off), k_cache, v_cache,
                       slots, cache, rot_dim, heads, kv_heads, head_dim]
    lib.launch(spec, [*args, stride, stride, int(halves)])
    name = f"{spec.name} rot_dim {rot_dim} head_dim {head_dim} {'halves' if halves else 'interleaved'}"
    assert_close(dt.decode(qkv), expected, dt.atol, dt.rtol, f"{name} q (and K, V untouched)")
    assert_close(dt.decode(k_cache), want_k, dt.atol, dt.rtol, f"{name} k_cache")
    assert_close(dt.decode(v_cache), want_v, 0.0, 0.0, f"{name} v_cache")  # a copy: exact


def check_gated_activation(lib: EmuLib, dt: DType, activation: str = "silu", tokens: int = 5, d: int = 200,
                           seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = dt.encode(rng.standard_normal((tokens, 2 * d)) * 4.0)
    want = {"silu": reference.silu_mul, "gelu_tanh": reference.gelu_tanh_mul}[activation]
    expected = want(dt.decode(x))
    spec = launch.gated_activation(activation, dt.name, tokens, d)
    out = nan_like(dt, (tokens, d))
    lib.launch(spec, [out, x, d])
    assert_close(dt.decode(out), expected, dt.atol, dt.rtol, spec.name)
