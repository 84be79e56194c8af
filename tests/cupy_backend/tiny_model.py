"""A tiny Llama GGUF whose head size the attention kernels are compiled for (the default tiny model has
head_dim 16): 2 layers, hidden 128, 2 query heads of 64 sharing 1 KV head (GQA 2), FFN 256, float32; and the
same shape quantized like the default model (Q4_1 matrices, a Q8_0 embedding that is also the output head),
with a Q4_0 and an F16 matrix besides; and a wider one (hidden 256, so every matrix's rows are whole K-quant
super-blocks) in the types a Q4_K_M file mixes, the other Q5 blocks, and Q2_K and Q3_K."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from backends.model.architecture import ARCHITECTURES
from tests.backends.tiny_gguf import TinyShape, write_tiny_llama

SHAPE = TinyShape(layers=2, hidden=128, heads=2, kv_heads=1, ffn=256, context=256, weight_scale=0.15)
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, CONTEXT = (SHAPE.hidden, SHAPE.heads, SHAPE.kv_heads, SHAPE.ffn,
                                                 SHAPE.layers, SHAPE.context)
HEAD_DIM = SHAPE.head_dim


def write_tiny_llama_d64(path: Path, seed: int = 0) -> Path:
    return write_tiny_llama(path, weight_type=Q.F32, seed=seed, shape=SHAPE)


# Per tensor types of the quantized tiny model; every other matrix is Q4_1.
QUANT_TYPES = {"token_embd.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_0, "blk.1.attn_output.weight": Q.F16}


def write_tiny_llama_d64_quant(path: Path, seed: int = 0) -> Path:
    return write_tiny_llama(path, weight_type=Q.Q4_1, seed=seed, shape=SHAPE, types=QUANT_TYPES)


K_SHAPE = TinyShape(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, context=256, weight_scale=0.1)
# Every type the kernels gained besides Q4_0 / Q4_1 / Q8_0, each read by the GEMV and dequantized: per layer, Q, K
# and V share a type (they are stacked as stored), as do gate and up; the embedding, also the head, is Q6_K.
# (blk.1.ffn_down keeps the default Q4_K.)
K_QUANT_TYPES = {
    "token_embd.weight": Q.Q6_K,
    **{f"blk.0.{name}.weight": Q.Q5_0 for name in ("attn_q", "attn_k", "attn_v")},
    **{f"blk.1.{name}.weight": Q.Q5_1 for name in ("attn_q", "attn_k", "attn_v")},
    "blk.0.attn_output.weight": Q.Q5_K,
    "blk.1.ffn_gate.weight": Q.Q5_K, "blk.1.ffn_up.weight": Q.Q5_K,
    "blk.0.ffn_down.weight": Q.Q6_K,
    "blk.1.attn_output.weight": Q.Q2_K,
    "blk.0.ffn_gate.weight": Q.Q3_K, "blk.0.ffn_up.weight": Q.Q3_K,
}


def write_tiny_llama_k_quant(path: Path, seed: int = 0) -> Path:
    """K_SHAPE with K_QUANT_TYPES; every other matrix Q4_K."""
    return write_tiny_llama(path, weight_type=Q.Q4_K, seed=seed, shape=K_SHAPE, types=K_QUANT_TYPES)


# Gemma 3 in small, at the head size its kernels are compiled for: 6 layers of which the sixth is global, the
# others sliding over a window of 16 that the scenarios' contexts outgrow; 2 query heads of 256 over 1 KV head,
# Q (512) wider than hidden (128), as in Gemma 3. Embeddings small enough that, scaled by sqrt(hidden), they do
# not drown what the layers add (the tied head would otherwise just echo each input token).
GEMMA3_SHAPE = TinyShape(layers=6, hidden=128, heads=2, kv_heads=1, ffn=256, context=256, weight_scale=0.2,
                         head_size=256, sliding_window=16, embedding_std=0.05)


def write_tiny_gemma3_d256(path: Path, seed: int = 0) -> Path:
    return write_tiny_llama(path, arch="gemma3", weight_type=Q.F32, seed=seed, shape=GEMMA3_SHAPE)


def write_tiny_feature_model(path: Path, arch: str, seed: int = 0) -> Path:
    """SHAPE (head_dim 64, float32) as `arch` with what the family brings beyond Llama's layer: Qwen2's QKV biases,
    Qwen3's QK norms (both RoPE over head halves); for "llama", Llama 3's RoPE frequency factors (1 to 8)."""
    rng = np.random.default_rng(seed + 1)
    extra = {f"blk.{i}.attn_{p}.bias": rng.normal(0, 0.3, HEAD_DIM * heads)
             for i in range(LAYERS) for p, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}
    if arch == "llama":
        extra = {"rope_freqs.weight": np.geomspace(1.0, 8.0, HEAD_DIM // 2)}
    elif not ARCHITECTURES[arch].qkv_bias:
        extra = {}
    return write_tiny_llama(path, arch=arch, weight_type=Q.F32, seed=seed, shape=SHAPE, extra=extra)
