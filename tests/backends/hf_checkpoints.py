"""Writing Hugging Face checkpoint directories in tests: a loaded model's weights under transformers' Llama names
and row order, in float32 (the safetensors library) or bfloat16 (bench.synthetic_checkpoint's writer: NumPy has no
bfloat16), with a config.json and the model's own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from backends.model.loader import LoadedModel, ModelFiles
from backends.model.quant import dense
from bench.synthetic_checkpoint import write_bfloat16


def hf_rows(gguf_rows: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's Q or K rows from GGUF's: the inverse of llama.cpp's converter's permutation, which puts
    each head's RoPE pairs (d/2 apart in HF) side by side."""
    d = gguf_rows.shape[0] // heads
    return gguf_rows.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(gguf_rows.shape)


def hf_tensors(model: LoadedModel) -> dict[str, np.ndarray]:
    """The model's float32 weights under transformers' Llama names and row order."""
    c, w = model.config, model.weights
    out = {"model.embed_tokens.weight": dense(w.embedding), "model.norm.weight": w.final_norm}
    for i, layer in enumerate(w.layers):
        q, k, v = np.split(dense(layer.wqkv), [c.q_size, c.q_size + c.kv_size])
        gate, up = np.split(dense(layer.w_gate_up), 2)
        prefix = f"model.layers.{i}."
        out |= {prefix + "input_layernorm.weight": layer.attn_norm,
                prefix + "self_attn.q_proj.weight": hf_rows(q, c.num_heads),
                prefix + "self_attn.k_proj.weight": hf_rows(k, c.num_kv_heads),
                prefix + "self_attn.v_proj.weight": v, prefix + "self_attn.o_proj.weight": dense(layer.wo),
                prefix + "post_attention_layernorm.weight": layer.ffn_norm, prefix + "mlp.gate_proj.weight": gate,
                prefix + "mlp.up_proj.weight": up, prefix + "mlp.down_proj.weight": dense(layer.w_down)}
    return {name: np.ascontiguousarray(t, np.float32) for name, t in out.items()}


def write_bfloat16_checkpoint(model: LoadedModel, files: ModelFiles, directory: Path) -> Path:
    """`model` (a Llama, its head tied) as a checkpoint of bfloat16 matrices, with config.json and tokenizer.json
    from `files`."""
    c = model.config
    directory.mkdir(parents=True)
    write_bfloat16(directory / "model.safetensors", hf_tensors(model))
    config = {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
              "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
              "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length, "tie_word_embeddings": True,
              "bos_token_id": files.tokenizer.bos_token_id, "eos_token_id": files.tokenizer.eos_token_ids[0]}
    (directory / "config.json").write_text(json.dumps(config))
    files.tokenizer.fast.save(str(directory / "tokenizer.json"))
    return directory
