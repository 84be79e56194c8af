"""A tiny Llama GGUF whose head size the attention kernels are compiled for (tests/backends/tiny_gguf.py
writes head_dim 16): 2 layers, hidden 128, 2 query heads of 64 sharing 1 KV head (GQA 2), FFN 256."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.backends.tiny_gguf import TOKENS

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, CONTEXT = 128, 2, 1, 256, 2, 256
HEAD_DIM = HIDDEN // HEADS


def write_tiny_llama_d64(path: Path, seed: int = 0) -> Path:
    """Random float32 weights; norms near 1 so activations stay O(1) through both layers."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    _metadata(writer)
    kv = KV_HEADS * HEAD_DIM
    writer.add_tensor("token_embd.weight", rng.normal(0, 0.5, (len(TOKENS), HIDDEN)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    for i in range(LAYERS):
        for name, shape in shapes.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", rng.normal(0, 0.15, shape).astype(np.float32))
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{name}.weight", (1 + rng.normal(0, 0.1, HIDDEN)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _metadata(writer: gguf.GGUFWriter) -> None:
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
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
