"""RoPE on interleaved pairs over GGUF's Q/K layout equals the reference's rotate-halves over un-permuted
weights: the attention scores (what RoPE is for) agree."""

from __future__ import annotations

import numpy as np

from backends.model.loader import LoadedModel
from backends.numpy_backend.layers import RopeTable, rms_norm


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's conversion permutation: rows back to the (first half, second half) order per head."""
    out_dim = w.shape[0]
    return w.reshape(heads, out_dim // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def rotate_halves(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    dim = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, dim, 2) / dim)
    angles = positions[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos[:, None, :] + np.concatenate([-second, first], -1) * sin[:, None, :]


def test_interleaved_rope_on_gguf_layout_matches_rotate_halves_on_hf_layout(real_model: LoadedModel) -> None:
    model = real_model
    cfg, layer = model.config, model.weights.layers[3]
    rng = np.random.default_rng(0)
    x = rms_norm(rng.normal(size=(12, cfg.hidden_size)).astype(np.float32), layer.attn_norm, cfg.rms_eps)
    positions = np.arange(100, 112)
    wq, wk = layer.wqkv[: cfg.q_size], layer.wqkv[cfg.q_size : cfg.q_size + cfg.kv_size]
    rope = RopeTable.build(cfg.head_dim, cfg.rope_theta, 256)
    ours_q = rope.apply((x @ wq.T).reshape(12, cfg.num_heads, -1), positions)
    ours_k = rope.apply((x @ wk.T).reshape(12, cfg.num_kv_heads, -1), positions)
    ref_q = rotate_halves((x @ unpermute(wq, cfg.num_heads).T).reshape(12, cfg.num_heads, -1), positions,
                          cfg.rope_theta)
    ref_k = rotate_halves((x @ unpermute(wk, cfg.num_kv_heads).T).reshape(12, cfg.num_kv_heads, -1), positions,
                          cfg.rope_theta)
    ours = np.einsum("qhd,khd->hqk", ours_q[:, :: cfg.kv_group_size], ours_k)
    ref = np.einsum("qhd,khd->hqk", ref_q[:, :: cfg.kv_group_size], ref_k)
    # Scores up to 89: each side measured within 4.3e-5 of a float64 run of the same formulas (AVX2 host; the 576-long
    # float32 projections dominate, sqrt(576) * 2^-24 of their terms' sizes), so two summation orders may differ by
    # twice that: 2x of 2 * 4.3e-5. (Here they share the projections' order: 8.9e-6 apart.)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=2e-4)
    # and the layouts really differ (the test would be empty if the permutation were the identity): by up to 11.2
    assert not np.allclose(ours_q, ref_q, atol=1e-2)
