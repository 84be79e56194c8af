"""Random-weight models in a real model's shape, for GPU checks and benchmarks on machines without the model
file: step time and memory traffic depend on the shapes (and how the weights are stored), not on the values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from backends.model.config import ModelConfig
from backends.model.loader import LoadedModel, ModelFiles
from backends.model.quant import Matrix, QuantMatrix
from backends.model.weights import LayerWeights, ModelWeights

# SmolLM2-135M-Instruct, the default model (see the golden file's config).
SMOLLM2 = ModelConfig(
    name="synthetic SmolLM2-135M shape",
    architecture="llama",
    num_layers=30,
    hidden_size=576,
    intermediate_size=1536,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_eps=1e-5,
    vocab_size=49152,
    context_length=8192,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def smollm2_shape(num_layers: int = 30) -> ModelConfig:
    return replace(SMOLLM2, num_layers=num_layers)


def random_weights(config: ModelConfig, seed: int = 0) -> ModelWeights:
    """float32 weights scaled like a trained model's (unit-variance activations, norms near 1), with a
    head tied to the embedding as in SmolLM2."""
    rng = np.random.default_rng(seed)
    hidden, ffn = config.hidden_size, config.intermediate_size

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols**-0.5)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(hidden, dtype=np.float32)).astype(np.float32)

    layers = tuple(
        LayerWeights(
            attn_norm=norm(),
            wqkv=matrix(config.q_size + 2 * config.kv_size, hidden),
            wo=matrix(hidden, config.q_size),
            ffn_norm=norm(),
            w_gate_up=matrix(2 * ffn, hidden),
            w_down=matrix(hidden, ffn),
        )
        for _ in range(config.num_layers)
    )
    embedding = rng.standard_normal((config.vocab_size, hidden), dtype=np.float32)
    return ModelWeights(embedding=embedding, layers=layers, final_norm=norm(), lm_head=embedding)


def synthetic_model(config: ModelConfig, seed: int = 0) -> LoadedModel:
    """A LoadedModel of random weights, for backends (which read only .config and .weights): it has no
    tokenizer or chat template."""
    files = ModelFiles(path=Path(config.name), config=config, tokenizer=None, chat_template=None)  # type: ignore[arg-type]
    return LoadedModel(files=files, weights=random_weights(config, seed), load_seconds=0.0)


def stored_like_default(weights: ModelWeights) -> ModelWeights:
    """The weights as the default model's file stores them: every layer matrix Q4_1, the embedding (and the
    head tied to it) Q8_0; norms stay float32."""

    def q4_1(m: Matrix) -> QuantMatrix:
        return QuantMatrix.quantize(np.asarray(m), GGMLQuantizationType.Q4_1)

    layers = tuple(replace(layer, wqkv=q4_1(layer.wqkv), wo=q4_1(layer.wo), w_gate_up=q4_1(layer.w_gate_up),
                           w_down=q4_1(layer.w_down)) for layer in weights.layers)
    embedding = QuantMatrix.quantize(np.asarray(weights.embedding), GGMLQuantizationType.Q8_0)
    return replace(weights, embedding=embedding, layers=layers, lm_head=embedding)


# Byte offsets of each block's float16 fields (scales, mins) in the types the kernels read; the rest is integers.
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int) -> QuantMatrix:
    """A matrix of random bytes stored as `qtype` (a gguf type name of HALF_FIELDS): every integer, packed
    scale and sign occurs; the float16 fields are finite, of both signs and sizes from 1e-7 (float16
    subnormals) to about 3, or to about 0.03 for the K-quants, whose sub-block scales multiply them by up to 63
    (Q6_K: 128), so weights stay within a few thousand."""
    kind = GGMLQuantizationType[qtype.upper()]
    block, block_bytes = GGML_QUANT_SIZES[kind]
    data = rng.integers(0, 256, (rows, cols // block, block_bytes), dtype=np.uint8)
    fields = HALF_FIELDS[kind.name]
    size = 10.0 ** rng.integers(-7, 1 if block == 32 else -1, (rows, cols // block, len(fields)))
    halves = (rng.standard_normal(size.shape) * size).astype(np.float16).view(np.uint8)
    for i, at in enumerate(fields):
        data[..., at : at + 2] = halves[..., 2 * i : 2 * i + 2]
    return QuantMatrix(kind, (rows, cols), data.reshape(rows, -1))
