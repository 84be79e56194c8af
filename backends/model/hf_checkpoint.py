"""A Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json, ...) as the same tensor source
a GGUF file is: config.json's settings under GGUF's metadata keys, its tensors under GGUF's names and in GGUF's
row order, each as stored (float32, float16 or bfloat16, memory-mapped). The config, weight loader and forward
passes then serve it exactly as they serve the GGUF of the same model.

Both generations of config.json are read: RoPE's base and scaling at the top level (`rope_theta`,
`rope_scaling`) or, as transformers 5 writes them, in `rope_parameters`. Llama 3's RoPE scaling becomes the
`rope_freqs.weight` tensor llama.cpp's converter writes for it. Anything the served architectures do not compute
(another RoPE scaling, a sliding window, a tensor the architecture has no place for) is refused in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from backends.model.architecture import ARCHITECTURES
from backends.model.config import ModelConfig, ModelLoadError
from backends.model.gguf_file import TensorInfo
from backends.model.hf_tokenizer import read_json
from backends.model.safetensors_file import StoredTensor, read_tensors

CONFIG = "config.json"
# config.json's model_type -> the architecture that computes it (Mistral's layer is Llama's)
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_GLOBAL_HF, _LAYER_HF = ({v: k for k, v in names.items()} for names in (_GLOBAL, _LAYER))
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
ROPE_FREQS = "rope_freqs.weight"  # GGUF's name for Llama 3's per-pair RoPE frequency divisors
SCALINGS = ("default", "llama3")  # RoPE scalings computed


@dataclass(frozen=True)
class Checkpoint:
    """The tensor source of a checkpoint directory (gguf_file.GGUFFile's shape)."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]  # by GGUF name
    stored: dict[str, StoredTensor]  # by GGUF name
    permuted: dict[str, int]  # GGUF names whose rows are reordered for RoPE, and their head counts

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes (rows..., row bytes), in GGUF's row order."""
        tensor, info = self.stored[name], self.tensors[name]
        block_size, type_size = GGML_QUANT_SIZES[info.qtype]
        rows = tensor.data.reshape(*info.shape[:-1], info.shape[-1] // block_size * type_size)
        heads = self.permuted.get(name)
        return rows if heads is None else rows[interleaved_order(rows.shape[0], heads)]


def interleaved_order(rows: int, heads: int) -> np.ndarray:
    """Row order taking Hugging Face's Q or K rows (each head's RoPE pairs half a head apart) to GGUF's (pairs
    side by side), as llama.cpp's converter permutes them: GGUF row h*d + 2j + t is HF row h*d + t*d/2 + j."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def read_checkpoint(directory: Path, config: dict[str, Any], tokenizer_meta: dict[str, Any]) -> Checkpoint:
    """The checkpoint's tensors and metadata; `config` is its config.json, `tokenizer_meta` the tokenizer's ids
    under GGUF's keys."""
    arch = architecture_of(directory, config)
    meta = {**metadata_of(directory, config, arch), **tokenizer_meta}
    stored = {**_gguf_named(read_tensors(directory), config), **_rope_freqs(config)}
    permuted = _permuted(stored, config) if ARCHITECTURES[arch].rope_pairs == "interleaved" else {}
    tensors = {name: TensorInfo(name, t.shape, t.qtype, 0) for name, t in stored.items()}
    return Checkpoint(directory, meta, tensors, stored, permuted)


def read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise ModelLoadError(f"model directory not found: {directory}")
    return read_json(directory / CONFIG)


def architecture_of(directory: Path, config: dict[str, Any]) -> str:
    kind = config.get("model_type")
    arch = MODEL_TYPES.get(str(kind))
    if arch is None or arch not in ARCHITECTURES:
        served = ", ".join(t for t, a in MODEL_TYPES.items() if a in ARCHITECTURES)
        raise ModelLoadError(f"{directory}: model_type {kind!r} is not supported (supported: {served})")
    _refuse_unserved(directory, config, arch)
    return arch


def _refuse_unserved(directory: Path, config: dict[str, Any], arch: str) -> None:
    """What config.json asks for that the architecture's forward does not compute."""
    scaling = _rope_type(config)
    if scaling not in SCALINGS:
        raise ModelLoadError(f"{directory}: RoPE scaling {scaling!r} is not supported (served: {', '.join(SCALINGS)})")
    window = config.get("sliding_window")
    if config.get("use_sliding_window", arch == "llama") and window and window < _context(config):
        raise ModelLoadError(f"{directory}: a sliding window ({window} positions) is not supported for {arch}")
    if arch == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise ModelLoadError(f"{directory}: biases in attention or MLP are not supported for {arch}")


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE's settings: transformers 5's rope_parameters, or the older top-level rope_theta and rope_scaling."""
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        return params
    scaling = config.get("rope_scaling")
    return {**(scaling if isinstance(scaling, dict) else {}), "rope_theta": config.get("rope_theta", 10000.0)}


def _rope_type(config: dict[str, Any]) -> str:
    return str(_rope(config).get("rope_type") or _rope(config).get("type") or "default")


def _rope_freqs(config: dict[str, Any]) -> dict[str, StoredTensor]:
    """Llama 3's scaling as the tensor the GGUF of the same model holds, so that the rest of the loader reads
    both formats alike; none for plain RoPE."""
    if _rope_type(config) != "llama3":
        return {}
    factors = llama3_rope_factors(_rope(config), _head_dim(config))
    return {ROPE_FREQS: StoredTensor(factors.shape, GGMLQuantizationType.F32, factors.view(np.uint8))}


def llama3_rope_factors(rope: dict[str, Any], head_dim: int) -> np.ndarray:
    """Each RoPE pair's frequency divisor for rope_type llama3, as llama.cpp's converter computes it (its
    LlamaModel.generate_extra_tensors): pairs of wavelength below original_max_position_embeddings /
    high_freq_factor keep theirs, those above / low_freq_factor are divided by `factor`, those between
    interpolated. The base frequencies are rounded to float32 as the converter's torch code rounds them."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = 1.0 / (float(rope["rope_theta"]) ** exponents.astype(np.float64)).astype(np.float32)
    wavelength = 2 * np.pi / freqs.astype(np.float64)
    factor, low, high = (float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    context = float(rope["original_max_position_embeddings"])
    smooth = (context / wavelength - low) / (high - low)
    between = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelength < context / high, 1.0,
                    np.where(wavelength > context / low, factor, between)).astype(np.float32)


def _head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))


def _context(config: dict[str, Any]) -> int:
    return int(config.get("max_position_embeddings", 2048))


def metadata_of(directory: Path, config: dict[str, Any], arch: str) -> dict[str, Any]:
    """config.json's settings under the GGUF keys config.config_from_metadata reads."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    keys = {"embedding_length": hidden, "block_count": config["num_hidden_layers"],
            "feed_forward_length": config["intermediate_size"], "attention.head_count": heads,
            "attention.head_count_kv": config.get("num_key_value_heads") or heads,
            "attention.key_length": _head_dim(config),
            "rope.freq_base": float(_rope(config).get("rope_theta", 10000.0)),
            "attention.layer_norm_rms_epsilon": config.get("rms_norm_eps", 1e-6),
            "vocab_size": config["vocab_size"], "context_length": _context(config)}
    return {"general.architecture": arch, "general.name": directory.name,
            **{f"{arch}.{key}": value for key, value in keys.items()}}


def _gguf_named(tensors: dict[str, StoredTensor], config: dict[str, Any]) -> dict[str, StoredTensor]:
    """The tensors the forward reads, under GGUF's names; a tied head's copy (some checkpoints keep one) and
    anything else (rotary tables) left out."""
    named = {}
    for name, tensor in tensors.items():
        gguf = gguf_name(name)
        if gguf is not None and not (gguf == "output.weight" and config.get("tie_word_embeddings", True)):
            named[gguf] = tensor
    return named


def gguf_name(name: str) -> str | None:
    """GGUF's name for a checkpoint tensor the forward reads; None for any other."""
    base, _, kind = name.rpartition(".")
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{kind}"
    found = _LAYER_NAME.fullmatch(name)
    if found is None or found.group(2) not in _LAYER:
        return None
    return f"blk.{found.group(1)}.{_LAYER[found.group(2)]}.{found.group(3)}"


def _permuted(stored: dict[str, StoredTensor], config: dict[str, Any]) -> dict[str, int]:
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return {name: heads if ".attn_q." in name else kv_heads
            for name in stored if name.endswith((".attn_q.weight", ".attn_k.weight"))}


def check_shapes(checkpoint: Checkpoint, config: ModelConfig) -> None:
    """Every tensor the forward reads is there with the shape config.json implies, and no other (a bias the
    architecture has no place for would be dropped silently): refused in one line, naming the checkpoint's
    tensor, before anything is loaded."""
    expected = _expected_shapes(config, "output.weight" in checkpoint.tensors)
    for name, shape in expected.items():
        info = checkpoint.tensors.get(name)
        if info is None:
            raise ModelLoadError(f"{checkpoint.path}: tensor {hf_name(name)} is missing")
        if info.shape != shape:
            raise ModelLoadError(f"{checkpoint.path}: tensor {hf_name(name)} has shape {list(info.shape)}, "
                                 f"config.json implies {list(shape)}")
    extra = sorted(set(checkpoint.tensors) - set(expected) - {ROPE_FREQS})
    if extra:
        raise ModelLoadError(f"{checkpoint.path}: tensor {hf_name(extra[0])} has no place in {config.architecture}")


def _expected_shapes(c: ModelConfig, untied: bool) -> dict[str, tuple[int, ...]]:
    h = c.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    if untied:
        shapes["output.weight"] = (c.vocab_size, h)
    for i in range(c.num_layers):
        shapes |= {f"blk.{i}.{part}": shape for part, shape in _layer_shapes(c).items()}
    return shapes


def _layer_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor the architecture's layer has (Architecture.layer_tensors)."""
    h, f = c.hidden_size, c.intermediate_size
    weights = {"attn_norm": (h,), "attn_q": (c.q_size, h), "attn_k": (c.kv_size, h), "attn_v": (c.kv_size, h),
               "attn_output": (h, c.q_size), "ffn_norm": (h,), "ffn_gate": (f, h), "ffn_up": (f, h),
               "ffn_down": (h, f), "attn_q_norm": (c.head_dim,), "attn_k_norm": (c.head_dim,),
               "post_attention_norm": (h,), "post_ffw_norm": (h,)}
    biases = {"attn_q": (c.q_size,), "attn_k": (c.kv_size,), "attn_v": (c.kv_size,)}
    shapes = {f"{part}.weight": shape for part, shape in weights.items()} | {f"{p}.bias": s for p, s in biases.items()}
    return {tensor: shapes[tensor] for tensor in c.arch.layer_tensors}


def hf_name(gguf: str) -> str:
    """The checkpoint's name for a GGUF tensor name (for messages)."""
    base, _, kind = gguf.rpartition(".")
    if base in _GLOBAL_HF:
        return f"{_GLOBAL_HF[base]}.{kind}"
    _, layer, part = base.split(".", 2)
    return f"model.layers.{layer}.{_LAYER_HF[part]}.{kind}"
