"""Write small GGUF files for tests: random weights in the quantization types we load, of Llama's architecture or
Gemma 3's (its QK and sandwich norms, sliding layers with their own window and RoPE base)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from backends.model.architecture import ARCHITECTURES
from tests import quantize_k

TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *[chr(c) for c in range(ord("a"), ord("z") + 1)], "Ġ",
          "ab", "Ġa"]


@dataclass(frozen=True)
class Vocab:
    """A GGUF tokenizer's fields."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int = 1
    eos: int = 2

    @classmethod
    def of_file(cls, path: Path) -> Vocab:
        """Another GGUF file's tokenizer (a draft model for it has the same tokens)."""
        fields = gguf.GGUFReader(str(path)).fields

        def strings(name: str) -> list[str]:
            field = fields[name]
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

        def number(name: str) -> int:
            return int(fields[name].parts[-1][0])

        types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
        return cls(strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges"),
                   number("tokenizer.ggml.bos_token_id"), number("tokenizer.ggml.eos_token_id"))


TINY_VOCAB = Vocab(TOKENS, [3, 3, 3] + [1] * (len(TOKENS) - 3), ["a b", "Ġ a"])


@dataclass(frozen=True)
class TinyShape:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    context: int = 256
    weight_scale: float = 0.2
    head_size: int = 0  # 0: hidden / heads
    sliding_window: int = 0  # the sliding layers' (architectures with them)
    embedding_std: float = 0.5  # of the random embedding (Gemma's is scaled by sqrt(hidden) on the way in)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads


# Gemma 3's shape in small: 4 query heads over 1 kv head, heads wider than hidden / heads (Q is 128 wide, hidden
# 64), 7 layers of which the sixth is global, a window of 8 that short prompts outgrow.
GEMMA3_SHAPE = TinyShape(layers=7, heads=4, kv_heads=1, head_size=32, sliding_window=8)


def write_tiny_llama(path: Path, arch: str = "llama", weight_type: Q = Q.Q8_0, seed: int = 0,
                     shape: TinyShape = TinyShape(), types: dict[str, Q] | None = None,
                     vocab: Vocab = TINY_VOCAB, extra: dict[str, np.ndarray] | None = None) -> Path:
    """Random weights (matrices stored as `weight_type`, or as `types` names them by tensor name; norms near 1)
    over `vocab` (a 32-token vocabulary unless given); `extra`: more float32 tensors by name (biases,
    rope_freqs)."""
    types = types or {}
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, shape, vocab)
    hidden, ffn, kv, q = shape.hidden, shape.ffn, shape.kv_heads * shape.head_dim, shape.heads * shape.head_dim
    _tensor(writer, "token_embd.weight", rng.normal(0, shape.embedding_std, (len(vocab.tokens), hidden)),
            types.get("token_embd.weight", weight_type))
    _tensor(writer, "output_norm.weight", np.ones(hidden), Q.F32)
    for i in range(shape.layers):
        for name, dims in (("attn_q", (q, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                           ("attn_output", (hidden, q)), ("ffn_gate", (ffn, hidden)),
                           ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            tensor = f"blk.{i}.{name}.weight"
            _tensor(writer, tensor, rng.normal(0, shape.weight_scale, dims), types.get(tensor, weight_type))
        for name, width in _norms(arch, shape):
            _tensor(writer, f"blk.{i}.{name}.weight", 1 + rng.normal(0, 0.1, width), Q.F32)
    for name, values in (extra or {}).items():
        _tensor(writer, name, values, Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_gemma3(path: Path, weight_type: Q = Q.Q8_0, seed: int = 0, shape: TinyShape = GEMMA3_SHAPE) -> Path:
    return write_tiny_llama(path, "gemma3", weight_type, seed, shape)


def _norms(arch: str, shape: TinyShape) -> list[tuple[str, int]]:
    """A layer's norm tensors and their widths, as the architecture has them (an unknown one: Llama's, for files
    the loader must refuse)."""
    family = ARCHITECTURES.get(arch, ARCHITECTURES["llama"])
    return ([("attn_norm", shape.hidden), ("ffn_norm", shape.hidden)]
            + ([("attn_q_norm", shape.head_dim), ("attn_k_norm", shape.head_dim)] if family.qk_norm else [])
            + ([("post_attention_norm", shape.hidden), ("post_ffw_norm", shape.hidden)]
               if family.sandwich_norms else []))


def _metadata(writer: gguf.GGUFWriter, shape: TinyShape, vocab: Vocab) -> None:
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(1e6 if shape.sliding_window else 10000.0)  # the global layers' (Gemma 3's 1e6)
    if shape.head_size:
        writer.add_key_length(shape.head_size)
        writer.add_value_length(shape.head_size)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)


def _tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: Q) -> None:
    data = values.astype(np.float32)
    if qtype == Q.F32 or data.ndim == 1:
        writer.add_tensor(name, data)
    elif qtype == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):  # gguf cannot quantize these
        writer.add_tensor(name, quantize_k.quantize(data, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)
