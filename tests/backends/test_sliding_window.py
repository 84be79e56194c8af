"""A sliding layer's attention (numpy_backend/attention.py) against attention written out position by position:
each query sees the last `window` positions up to its own, whether it decodes or is one of a prompt chunk's
queries, and the layers of a model take their windows and RoPE bases from the architecture."""

from __future__ import annotations

import numpy as np
import pytest

from backends.model.config import config_from_metadata
from backends.numpy_backend.attention import decode_attention, prefill_attention

BLOCK, HEADS, KV_HEADS, DIM = 4, 4, 2, 8


def dense_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, position: int, window: int) -> np.ndarray:
    """One query (heads, d) at `position` over keys/values (positions, kv_heads, d), in float64."""
    first = max(0, position - window + 1) if window else 0
    group = HEADS // KV_HEADS
    out = np.empty((HEADS, DIM))
    for h in range(HEADS):
        k, v = keys[first : position + 1, h // group], values[first : position + 1, h // group]
        scores = k.astype(np.float64) @ q[h].astype(np.float64) / np.sqrt(DIM)
        weights = np.exp(scores - scores.max())
        out[h] = weights / weights.sum() @ v
    return out


def paged(length: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Keys and values of `length` positions, laid out in shuffled blocks of a cache; the table; the dense copies."""
    rng = np.random.default_rng(seed)
    keys, values = (rng.standard_normal((length, KV_HEADS, DIM)).astype(np.float32) for _ in range(2))
    blocks = -(-length // BLOCK)
    table = rng.permutation(blocks + 3)[:blocks].astype(np.int32)
    k_cache, v_cache = (np.zeros((blocks + 3, BLOCK, KV_HEADS, DIM), np.float32) for _ in range(2))
    for pos in range(length):
        k_cache[table[pos // BLOCK], pos % BLOCK], v_cache[table[pos // BLOCK], pos % BLOCK] = keys[pos], values[pos]
    return k_cache, v_cache, table, keys, values


# float32 dot products of 8 and sums of at most 23 weights of values near 1: a few 1e-7
TOL = 2e-6


@pytest.mark.parametrize("window", [0, 1, 5, 8, 30])
@pytest.mark.parametrize("length", [1, 7, 23])
def test_a_decode_query_sees_its_window(window: int, length: int) -> None:
    k_cache, v_cache, table, keys, values = paged(length, seed=length)
    q = np.random.default_rng(window).standard_normal((1, HEADS, DIM)).astype(np.float32)
    out = decode_attention(q, k_cache, v_cache, table[None], np.array([length]), window=window)
    np.testing.assert_allclose(out[0], dense_attention(q[0], keys, values, length - 1, window), atol=TOL)


@pytest.mark.parametrize("window", [0, 1, 5, 8])
def test_each_query_of_a_chunk_sees_its_own_window(window: int) -> None:
    length, chunk = 19, 11  # the chunk's queries are positions 8..18
    k_cache, v_cache, table, keys, values = paged(length, seed=3)
    q = np.random.default_rng(4).standard_normal((chunk, HEADS, DIM)).astype(np.float32)
    out = prefill_attention(q, k_cache, v_cache, table, length, window=window)
    for i in range(chunk):
        position = length - chunk + i
        np.testing.assert_allclose(out[i], dense_attention(q[i], keys, values, position, window), atol=TOL)


def gemma3_metadata(layers: int) -> dict[str, object]:
    return {"general.architecture": "gemma3", "gemma3.embedding_length": 64, "gemma3.attention.head_count": 2,
            "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 32, "gemma3.block_count": layers,
            "gemma3.feed_forward_length": 128, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma3.context_length": 4096, "gemma3.rope.freq_base": 1e6, "gemma3.attention.sliding_window": 512,
            "tokenizer.ggml.tokens": ["a"] * 10}


def test_every_sixth_gemma3_layer_is_global_with_the_files_rope_base() -> None:
    config = config_from_metadata(gemma3_metadata(13), "tiny")
    windows = [config.layer_window(i) for i in range(13)]
    assert windows == [512] * 5 + [0] + [512] * 5 + [0] + [512]
    assert [config.layer_rope_base(i) for i in (0, 5, 6, 11)] == [10_000.0, 1e6, 10_000.0, 1e6]
    assert config.head_dim == 32  # attention.key_length, not hidden / heads


def test_llama_layers_attend_to_everything() -> None:
    meta = {k.replace("gemma3", "llama"): v for k, v in gemma3_metadata(4).items()} | {"general.architecture": "llama"}
    config = config_from_metadata(meta, "tiny")
    assert [config.layer_window(i) for i in range(4)] == [0] * 4 and config.arch.features == ()
