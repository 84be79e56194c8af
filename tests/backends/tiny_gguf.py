"""Write small Llama-architecture GGUF files for tests: random weights in the quantization types we load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *[chr(c) for c in range(ord("a"), ord("z") + 1)], "Ġ",
          "ab", "Ġa"]


@dataclass(frozen=True)
class TinyShape:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    context: int = 256
    weight_scale: float = 0.2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def write_tiny_llama(path: Path, arch: str = "llama", weight_type: Q = Q.Q8_0, seed: int = 0,
                     shape: TinyShape = TinyShape(), types: dict[str, Q] | None = None) -> Path:
    """Random weights (matrices stored as `weight_type`, or as `types` names them by tensor name; norms near 1)
    over a 32-token vocabulary."""
    types = types or {}
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, shape)
    hidden, ffn, kv = shape.hidden, shape.ffn, shape.kv_heads * shape.head_dim
    _tensor(writer, "token_embd.weight", rng.normal(0, 0.5, (len(TOKENS), hidden)),
            types.get("token_embd.weight", weight_type))
    _tensor(writer, "output_norm.weight", np.ones(hidden), Q.F32)
    for i in range(shape.layers):
        for name, dims in (("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                           ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)),
                           ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            tensor = f"blk.{i}.{name}.weight"
            _tensor(writer, tensor, rng.normal(0, shape.weight_scale, dims), types.get(tensor, weight_type))
        for name in ("attn_norm", "ffn_norm"):
            _tensor(writer, f"blk.{i}.{name}.weight", 1 + rng.normal(0, 0.1, hidden), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(writer: gguf.GGUFWriter, shape: TinyShape) -> None:
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(["a b", "Ġ a"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def _tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: Q) -> None:
    data = values.astype(np.float32)
    if qtype == Q.F32 or data.ndim == 1:
        writer.add_tensor(name, data)
    elif qtype == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)
