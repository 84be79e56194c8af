"""A Hugging Face checkpoint directory of random weights in SmolLM2-135M's shape with its real tokenizer: what a
serving benchmark needs where no model file is installed (a GPU machine). The config, tokenizer, template and
generation files are tests/golden/smollm2_hf's, the tokenizer the model's own; the matrices are random bfloat16,
each row's scale 1/sqrt(its width) so activations stay near unit size; the norms are ones.

The safetensors file is written here by hand: NumPy has no bfloat16, and the format is a JSON header and bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

SMOLLM2_FILES = Path(__file__).resolve().parents[1] / "tests" / "golden" / "smollm2_hf"
COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def write_bfloat16(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """float32 tensors as a safetensors file: matrices cut to their top 16 bits (bfloat16), vectors as F32; and
    the index naming the file for each tensor."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = (t.view(np.uint32) >> 16).astype(np.uint16).tobytes() if t.ndim == 2 else t.tobytes()
        header[name] = {"dtype": "BF16" if t.ndim == 2 else "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    index = {"weight_map": dict.fromkeys(header, path.name)}
    (path.parent / "model.safetensors.index.json").write_text(json.dumps(index))


def llama_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a tied-head Llama checkpoint under transformers' names."""
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, ffn = config.get("head_dim", hidden // heads), config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], hidden),
                                          "model.norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                   p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                   p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                   p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                   p + "mlp.down_proj.weight": (hidden, ffn)}
    return shapes


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[1] ** -0.5)
    return out


def write_smollm2_checkpoint(directory: Path, num_layers: int = 30, seed: int = 0) -> Path:
    """The checkpoint directory, created (it must not exist yet)."""
    directory.mkdir(parents=True)
    config = json.loads((SMOLLM2_FILES / "config.json").read_text()) | {"num_hidden_layers": num_layers}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    for name in COPIED:
        shutil.copyfile(SMOLLM2_FILES / name, directory / name)
    write_bfloat16(directory / "model.safetensors", random_tensors(llama_shapes(config), seed))
    return directory
