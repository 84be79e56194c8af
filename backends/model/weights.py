"""Float32 Llama weights dequantized from a GGUF file."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import quants

from backends.model.config import ModelConfig, ModelLoadError
from backends.model.gguf_file import GGUFFile

F32 = np.float32


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. Matrices are (out, in) as stored; the forward multiplies by their transpose.

    Q and K keep llama.cpp's GGUF row order, which pairs RoPE dimensions as (2i, 2i+1).
    """

    attn_norm: np.ndarray  # (H,)
    wqkv: np.ndarray  # (q_size + 2 * kv_size, H): Q, K and V projections stacked, one GEMM
    wo: np.ndarray  # (H, q_size)
    ffn_norm: np.ndarray  # (H,)
    w_gate_up: np.ndarray  # (2 * F, H): gate then up, one GEMM
    w_down: np.ndarray  # (H, F)


@dataclass(frozen=True)
class ModelWeights:
    embedding: np.ndarray  # (V, H)
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # (H,)
    lm_head: np.ndarray  # (V, H); the embedding itself when tied

    @property
    def num_bytes(self) -> int:
        arrays = [self.embedding, self.final_norm, self.lm_head]
        arrays += [a for layer in self.layers for a in vars(layer).values()]
        unique = {id(a): a for a in arrays}
        return sum(a.nbytes for a in unique.values())


def dequantize(gguf: GGUFFile, name: str) -> np.ndarray:
    """One tensor as float32 in its NumPy shape; unsupported types are refused naming tensor and type."""
    info = gguf.tensors.get(name)
    if info is None:
        raise ModelLoadError(f"{gguf.path}: tensor '{name}' is missing")
    try:
        out = quants.dequantize(gguf.raw(name), info.qtype)
    except NotImplementedError:
        raise ModelLoadError(
            f"{gguf.path}: tensor '{name}' has type {info.qtype.name}, which pagedserve cannot dequantize"
        ) from None
    return np.ascontiguousarray(out.reshape(info.shape), dtype=F32)


def load_weights(gguf: GGUFFile, config: ModelConfig) -> ModelWeights:
    """Dequantize every tensor the forward needs, in parallel (NumPy releases the GIL)."""
    names = _tensor_names(gguf, config)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        arrays = dict(zip(names, pool.map(lambda n: dequantize(gguf, n), names), strict=True))
    embedding = arrays["token_embd.weight"]
    return ModelWeights(
        embedding=embedding,
        layers=tuple(_layer(arrays, i) for i in range(config.num_layers)),
        final_norm=arrays["output_norm.weight"],
        lm_head=arrays.get("output.weight", embedding),
    )


def _tensor_names(gguf: GGUFFile, config: ModelConfig) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight"]
    if "output.weight" in gguf.tensors:  # absent when the head is tied to the embedding
        names.append("output.weight")
    per_layer = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")
    names += [f"blk.{i}.{p}.weight" for i in range(config.num_layers) for p in per_layer]
    return names


def _layer(arrays: dict[str, np.ndarray], i: int) -> LayerWeights:
    def w(part: str) -> np.ndarray:
        return arrays.pop(f"blk.{i}.{part}.weight")  # pop: the stacked copies replace the originals

    return LayerWeights(
        attn_norm=w("attn_norm"),
        wqkv=np.concatenate([w("attn_q"), w("attn_k"), w("attn_v")]),
        wo=w("attn_output"),
        ffn_norm=w("ffn_norm"),
        w_gate_up=np.concatenate([w("ffn_gate"), w("ffn_up")]),
        w_down=w("ffn_down"),
    )
