"""Tiny random Llama 3 / Mistral / Qwen2 / Qwen3 models as GGUF files, with transformers' logits for them.

For each case in CASES this builds a small randomly initialised model with Hugging Face ``transformers`` (2
layers, hidden 64, grouped-query attention, a 512-token vocabulary of its own), writes it as ``<case>.gguf``
with the ``gguf`` package's writer the way llama.cpp's ``convert_hf_to_gguf.py`` writes that architecture
(float32 tensors), and records in ``reference.json`` what ``transformers`` computes from the model it built, in
float32 with eager attention on the CPU: for a few prompts of token ids, greedy continuations (argmax over the
vocabulary), the top-1 minus top-2 margin at each step, the ten best logits at every generated position and the
whole logit row of the prompt's last position. The test (tests/golden/test_tiny_archs.py) loads each GGUF with
pagedserve and compares; it needs none of this script's packages.

What the GGUF holds, as llama.cpp's converter writes it:

* ``llama`` (Llama 3 and Mistral alike: GGUF names both ``llama``): Q and K rows permuted per head so RoPE
  rotates interleaved pairs (``LlamaModel.permute``); Llama 3's ``rope_type: llama3`` scaling as the
  ``rope_freqs.weight`` tensor, one frequency divisor per RoPE pair (``LlamaModel.generate_extra_tensors``),
  with no scaling metadata; an untied head as ``output.weight``.
* ``qwen2``: rows as Hugging Face keeps them (NeoX's RoPE over head halves), the Q/K/V biases as
  ``blk.N.attn_{q,k,v}.bias``; ``output.weight`` only when the head is untied.
* ``qwen3``: as qwen2 without biases, with ``blk.N.attn_{q,k}_norm.weight`` and ``qwen3.attention.key_length``
  / ``value_length`` (head_dim 32 where hidden / heads is 16).

Every GGUF is then loaded back with ``transformers``' own GGUF loader (``from_pretrained(dir,
gguf_file=...)``) and each of its parameters must equal the model's, bit for bit, and its logits the model's.
Two gaps of that loader are worked around and recorded: it ignores ``rope_freqs`` (so the Llama 3 file's
logits are compared with the same model run without the scaling), and it does not read
``qwen3.attention.key_length`` (head_dim is passed to it). For the Llama 3 case the record also holds the
greedy tokens without the scaling, which the test checks differ: it would fail with the factors ignored.

Run it by hand from the repository root with the reference virtual environment (torch 2.13, transformers
5.25, gguf 0.19; nothing is downloaded)::

    HF_HUB_OFFLINE=1 /work/refvenv/bin/python tests/golden/tiny_archs/make_reference.py

It takes about a minute and writes the GGUF files (140-200 kB each) and ``reference.json`` beside itself.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf
import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

HERE = Path(__file__).resolve().parent
VOCAB = 512
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=256, rms_norm_eps=1e-6)
GREEDY_STEPS = 16
TOP_K = 10
PROMPTS = {  # token ids: the vocabulary's own, no text needed
    "short": [1, 17, 300, 42, 7],
    "medium": [1, 5, 88, 401, 233, 90, 12, 506, 64, 3, 150, 271],
    "long": [1, *[(37 * i + 11) % (VOCAB - 3) + 3 for i in range(40)]],
}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@dataclass(frozen=True)
class Case:
    name: str
    gguf_arch: str  # general.architecture
    model_class: Any
    config: Any
    hf_kwargs: dict[str, Any] = field(default_factory=dict)  # what transformers' GGUF loader cannot read


CASES = [
    Case("llama3_untied", "llama", LlamaForCausalLM,
         LlamaConfig(**SHAPE, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)),
    Case("mistral", "llama", MistralForCausalLM,
         MistralConfig(**SHAPE, head_dim=16, sliding_window=None, tie_word_embeddings=False)),
    Case("qwen2_tied", "qwen2", Qwen2ForCausalLM,
         Qwen2Config(**SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True)),
    Case("qwen2_untied", "qwen2", Qwen2ForCausalLM,
         Qwen2Config(**SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=False)),
    Case("qwen3", "qwen3", Qwen3ForCausalLM,
         Qwen3Config(**SHAPE, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                     tie_word_embeddings=True), hf_kwargs={"head_dim": 32}),
]


def initialise(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that logits spread over several units (clear greedy margins): matrices N(0, 0.15)
    (the untied head 0.3), embeddings N(0, 1), biases N(0, 0.5), every norm 1 + N(0, 0.1) so that none is a
    no-op."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
            else:
                std = 1.0 if "embed_tokens" in name else 0.3 if name == "lm_head.weight" else 0.15
                param.copy_(std * torch.randn(param.shape, generator=gen))


def build(case: Case, seed: int) -> Any:
    model = case.model_class(case.config)
    initialise(model, seed)
    model.config._attn_implementation = "eager"
    return model.eval()


# ---- the GGUF, as llama.cpp's converter writes it ----

def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rows from NeoX's halves to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(config: Any) -> np.ndarray:
    """llama.cpp's LlamaModel.generate_extra_tensors for rope_type llama3 (the rope parameters' original context)."""
    rope = config.rope_parameters
    dim = config.head_dim
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, *module, kind = hf.split(".")
    return f"blk.{layer}.{GGUF_NAMES['.'.join(module)]}.{kind}"


def gguf_tensors(case: Case, model: Any) -> dict[str, np.ndarray]:
    cfg = model.config
    out = {}
    for hf, param in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # a tied head is the embedding: the converter writes no output.weight
        values = param.detach().numpy().astype(np.float32)
        if case.gguf_arch == "llama" and ".q_proj." in hf:
            values = permute(values, cfg.num_attention_heads)
        elif case.gguf_arch == "llama" and ".k_proj." in hf:
            values = permute(values, cfg.num_key_value_heads)
        out[gguf_name(hf)] = values
    if (cfg.rope_parameters or {}).get("rope_type") == "llama3":
        out["rope_freqs.weight"] = llama3_rope_factors(cfg)
    return out


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """3 control tokens, the 256 byte-level characters, then merges of two lowercase letters up to VOCAB."""
    byte_chars = gguf_byte_chars()
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pairs = [(a, b) for a in letters for b in letters][: VOCAB - 3 - 256]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_chars, *(a + b for a, b in pairs)]
    return tokens, [3, 3, 3] + [1] * (len(tokens) - 3), [f"{a} {b}" for a, b in pairs]


def gguf_byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_gguf(case: Case, model: Any, path: Path) -> None:
    cfg, arch = model.config, case.gguf_arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {case.name}")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "llama":  # LlamaModel.set_gguf_parameters
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_rope_dimension_count(cfg.head_dim)
    if getattr(cfg, "head_dim", None) and arch == "qwen3":  # TextModel.set_gguf_parameters: the config's head_dim
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    tokens, types, merges = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    for name, values in gguf_tensors(case, model).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---- the reference ----

@torch.no_grad()
def greedy(model: Any, ids: list[int]) -> list[int]:
    out: list[int] = []
    for _ in range(GREEDY_STEPS):
        logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
        out.append(int(torch.argmax(logits)))
    return out


@torch.no_grad()
def positions_logits(model: Any, ids: list[int], generated: list[int]) -> torch.Tensor:
    """Float32 logits of the positions that predict each generated token, from one pass."""
    return model(input_ids=torch.tensor([ids + generated[:-1]])).logits[0, len(ids) - 1:].float()


def record_prompt(model: Any, ids: list[int]) -> dict[str, Any]:
    generated = greedy(model, ids)
    logits = positions_logits(model, ids, generated)
    if [int(i) for i in torch.argmax(logits, dim=-1)] != generated:
        raise SystemExit("the one-pass argmax differs from the step-by-step greedy tokens")
    best2 = torch.topk(logits, 2, dim=-1).values
    top = torch.topk(logits, TOP_K, dim=-1)
    return {
        "token_ids": ids,
        "greedy": generated,
        "margins": [round(float(m), 6) for m in best2[:, 0] - best2[:, 1]],
        "top10": [{"ids": i, "logits": v} for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)],
        "last_prompt_logits": logits[0].tolist(),
    }


def without_rope_scaling(case: Case, model: Any) -> Any:
    """The same weights with plain RoPE: what a loader that drops rope_freqs computes."""
    cfg = case.config.__class__(**{**case.config.to_dict(), "rope_parameters": {
        "rope_type": "default", "rope_theta": case.config.rope_parameters["rope_theta"]}})
    plain = case.model_class(cfg)
    plain.load_state_dict(model.state_dict())
    plain.config._attn_implementation = "eager"
    return plain.eval()


@torch.no_grad()
def check_gguf_loader(case: Case, model: Any, path: Path) -> dict[str, Any]:
    """transformers' GGUF loader on our file gives the model's parameters bit for bit, and its logits (for Llama
    3: the model's without the scaling, rope_freqs being ignored by that loader)."""
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                  attn_implementation="eager", **case.hf_kwargs).eval()
    ours, theirs = model.state_dict(), loaded.state_dict()
    if set(ours) != set(theirs):
        raise SystemExit(f"{case.name}: parameters differ: {sorted(set(ours) ^ set(theirs))}")
    unequal = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    if unequal:
        raise SystemExit(f"{case.name}: transformers' GGUF loader gives other values for {unequal}")
    scaled = (case.config.rope_parameters or {}).get("rope_type") == "llama3"
    against = without_rope_scaling(case, model) if scaled else model
    worst = 0.0
    for ids in PROMPTS.values():
        diff = (loaded(input_ids=torch.tensor([ids])).logits - against(input_ids=torch.tensor([ids])).logits)
        worst = max(worst, float(diff.abs().max()))
    if worst > 0:
        raise SystemExit(f"{case.name}: transformers' GGUF loader's logits differ by {worst}")
    return {"parameters_equal": len(ours), "loader_class": type(loaded).__name__, "logits_max_abs_diff": worst,
            "compared_with": "the model without RoPE scaling (the loader ignores rope_freqs)" if scaled
            else "the model", "loader_kwargs": case.hf_kwargs}


def run_case(case: Case, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = build(case, seed)
    path = HERE / f"{case.name}.gguf"
    write_gguf(case, model, path)
    with tempfile.TemporaryDirectory() as folder:
        link = Path(folder) / path.name
        link.symlink_to(path)
        loader_check = check_gguf_loader(case, model, link)
    record: dict[str, Any] = {
        "gguf": path.name,
        "gguf_architecture": case.gguf_arch,
        "model_class": case.model_class.__name__,
        "config": json.loads(model.config.to_json_string()),
        "gguf_loader_check": loader_check,
        "prompts": {name: record_prompt(model, ids) for name, ids in PROMPTS.items()},
    }
    if (case.config.rope_parameters or {}).get("rope_type") == "llama3":
        plain = without_rope_scaling(case, model)
        record["rope_freqs"] = llama3_rope_factors(model.config).tolist()
        record["without_rope_scaling"] = {name: greedy(plain, ids) for name, ids in PROMPTS.items()}
    print(f"{case.name}: {path.stat().st_size} bytes; greedy {record['prompts']['short']['greedy'][:8]}; "
          f"smallest margin {min(min(p['margins']) for p in record['prompts'].values()):.4f}", flush=True)
    return record


def versions() -> dict[str, str]:
    found = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "gguf", "numpy")}
    found["python"] = sys.version.split()[0]
    return found


def main() -> None:
    torch.set_num_threads(1)  # a deterministic reduction order, whatever the host
    cases = {case.name: run_case(case, seed) for seed, case in enumerate(CASES)}
    record = {"versions": versions(), "reference": "transformers, float32, eager attention, CPU",
              "greedy_steps": GREEDY_STEPS, "cases": cases}
    out = HERE / "reference.json"
    # one line per list of numbers: 5 x 3 rows of 512 logits would take 7,680 lines
    text = re.sub(r"\[[-0-9.e,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)), json.dumps(record, indent=1))
    out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
