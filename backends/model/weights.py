"""Decoder weights from a GGUF file: each matrix kept as stored (a QuantMatrix) when the backend has kernels for
its type, else dequantized to float32; norms are always float32. Which tensors a layer has follows its
Architecture (architecture.py)."""

from __future__ import annotations

import os
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, quants

from backends.model.config import ModelConfig, ModelLoadError
from backends.model.gguf_file import TensorInfo, TensorSource
from backends.model.quant import Matrix, QuantMatrix, as_q8_0, dense, matrix_bytes

F32 = np.float32
Q = GGMLQuantizationType
StoredTypes = Collection[GGMLQuantizationType]  # types a backend reads as stored


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. Matrices are (out, in) as stored; the forward multiplies by their transpose.

    Q and K keep the GGUF's row order (Architecture.rope_pairs says how RoPE pairs their dimensions). The
    optional norms are None where the architecture has none.
    """

    attn_norm: np.ndarray  # (H,)
    wqkv: Matrix  # (q_size + 2 * kv_size, H): Q, K and V projections stacked, one GEMM
    wo: Matrix  # (H, q_size)
    ffn_norm: np.ndarray  # (H,): before the MLP
    w_gate_up: Matrix  # (2 * F, H): gate then up, one GEMM
    w_down: Matrix  # (H, F)
    q_norm: np.ndarray | None = None  # (head_dim,): over each Q head (Architecture.qk_norm)
    k_norm: np.ndarray | None = None  # (head_dim,): over each K head
    post_attn_norm: np.ndarray | None = None  # (H,): after attention (Architecture.sandwich_norms)
    post_ffn_norm: np.ndarray | None = None  # (H,): after the MLP
    qkv_bias: np.ndarray | None = None  # (q_size + 2 * kv_size,): added to wqkv's output (Architecture.qkv_bias)

    def arrays(self) -> list[Matrix]:
        """The layer's tensors that exist."""
        return [a for a in vars(self).values() if a is not None]


@dataclass(frozen=True)
class ModelWeights:
    embedding: Matrix  # (V, H)
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # (H,)
    lm_head: Matrix  # (V, H); the embedding itself when tied
    # "name (TYPE)" of each matrix asked for as stored but dequantized, its type having no kernel
    dequantized: tuple[str, ...] = ()

    @property
    def streamed_bytes(self) -> int:
        """Bytes a decode step reads: every layer matrix and the output head (not the embedding rows)."""
        arrays = [a for layer in self.layers for a in layer.arrays()]
        return sum(matrix_bytes(a) for a in (*arrays, self.lm_head, self.final_norm))

    @property
    def num_bytes(self) -> int:
        arrays: list[Matrix] = [self.embedding, self.final_norm, self.lm_head]
        arrays += [a for layer in self.layers for a in layer.arrays()]
        unique = {id(a): a for a in arrays}
        return sum(matrix_bytes(a) for a in unique.values())


def dequantize(gguf: TensorSource, name: str) -> np.ndarray:
    """One tensor as float32 in its NumPy shape; unsupported types are refused naming tensor and type."""
    info = _info(gguf, name)
    try:
        out = quants.dequantize(gguf.raw(name), info.qtype)
    except NotImplementedError:
        raise ModelLoadError(
            f"{gguf.path}: tensor '{name}' has type {info.qtype.name}, which pagedserve cannot dequantize"
        ) from None
    # a copy: gguf returns an F32 tensor as a view of the file's map, which would keep the whole map resident
    return np.array(out.reshape(info.shape), dtype=F32)


def _info(gguf: TensorSource, name: str) -> TensorInfo:
    info = gguf.tensors.get(name)
    if info is None:
        raise ModelLoadError(f"{gguf.path}: tensor '{name}' is missing")
    return info


def load_weights(gguf: TensorSource, config: ModelConfig, stored: StoredTypes = ()) -> ModelWeights:
    """Every tensor the forward needs: matrices of a type in `stored` as stored (no float32 copy is made), the
    rest dequantized, in parallel (NumPy releases the GIL)."""
    loader = _Loader(gguf, frozenset(stored))
    names = _tensor_names(gguf, config)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        arrays = dict(zip(names, pool.map(loader.load, names), strict=True))
    embedding = arrays["token_embd.weight"]
    layers = tuple(_layer(arrays, i, loader) for i in range(config.num_layers))
    return ModelWeights(embedding=embedding, layers=layers, final_norm=dense(arrays["output_norm.weight"]),
                        lm_head=arrays.get("output.weight", embedding), dequantized=tuple(sorted(loader.dequantized)))


class _Loader:
    """Loads one tensor as stored or as float32, and remembers what it had to dequantize."""

    def __init__(self, gguf: TensorSource, stored: frozenset[GGMLQuantizationType]) -> None:
        self.gguf, self.stored = gguf, stored
        self.dequantized: list[str] = []

    def load(self, name: str) -> Matrix:
        info = _info(self.gguf, name)
        if len(info.shape) == 2 and info.qtype in self.stored:
            return QuantMatrix.of(self.gguf.raw(name), info.qtype, info.shape[1])
        if len(info.shape) == 2 and self.stored and info.qtype != GGMLQuantizationType.F32:
            self.dequantized.append(f"{name} ({info.qtype.name})")
        return dequantize(self.gguf, name)

    def stack(self, name: str, parts: list[Matrix]) -> Matrix:
        """The parts as one matrix: stacked as stored when they share a type or become Q8_0 unchanged (Gemma 3's
        Q5_0 Q and K beside a Q8_0 V: 9 MB where a float32 copy took 35), else as float32."""
        if all(isinstance(p, QuantMatrix) for p in parts):
            quant = [p for p in parts if isinstance(p, QuantMatrix)]
            if len({p.qtype for p in quant}) == 1:
                return QuantMatrix.stack(quant)
            widened = [as_q8_0(p) for p in quant]
            if Q.Q8_0 in self.stored and all(w is not None for w in widened):
                return QuantMatrix.stack([w for w in widened if w is not None])
            self.dequantized.append(f"{name} (mixed {'/'.join(p.qtype.name for p in quant)})")
        return np.concatenate([dense(p) for p in parts])


_QKV = ("attn_q", "attn_k", "attn_v")


def _tensor_names(gguf: TensorSource, config: ModelConfig) -> list[str]:
    """What the architecture's layers hold (Architecture.layer_tensors), every layer's weights before any bias."""
    names = ["token_embd.weight", "output_norm.weight"]
    if "output.weight" in gguf.tensors:  # absent when the head is tied to the embedding
        names.append("output.weight")
    layer = config.arch.layer_tensors
    return names + [f"blk.{i}.{part}" for kind in (".weight", ".bias") for i in range(config.num_layers)
                    for part in layer if part.endswith(kind)]


def rope_freqs(gguf: TensorSource) -> tuple[float, ...]:
    """The file's RoPE frequency factors (Llama 3's scaling, as llama.cpp's converter stores it); none: empty."""
    return tuple(dequantize(gguf, "rope_freqs.weight").tolist()) if "rope_freqs.weight" in gguf.tensors else ()


def _layer(arrays: dict[str, Matrix], i: int, loader: _Loader) -> LayerWeights:
    def take(part: str) -> Matrix:
        return arrays.pop(f"blk.{i}.{part}.weight")  # pop: the stacked copies replace the originals

    def norm(part: str) -> np.ndarray | None:
        name = f"blk.{i}.{part}.weight"
        return dense(arrays.pop(name)) if name in arrays else None

    biases = [arrays.pop(f"blk.{i}.{p}.bias") for p in _QKV if f"blk.{i}.{p}.bias" in arrays]

    return LayerWeights(
        attn_norm=dense(take("attn_norm")),
        wqkv=loader.stack(f"blk.{i}.attn_qkv", [take("attn_q"), take("attn_k"), take("attn_v")]),
        wo=take("attn_output"),
        ffn_norm=dense(take("ffn_norm")),
        w_gate_up=loader.stack(f"blk.{i}.ffn_gate_up", [take("ffn_gate"), take("ffn_up")]),
        w_down=take("ffn_down"),
        q_norm=norm("attn_q_norm"),
        k_norm=norm("attn_k_norm"),
        post_attn_norm=norm("post_attention_norm"),
        post_ffn_norm=norm("post_ffw_norm"),
        qkv_bias=np.concatenate([dense(b) for b in biases]) if biases else None,
    )
