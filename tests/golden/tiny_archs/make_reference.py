"""Tiny random Llama 3 / Mistral / Qwen2 / Qwen3 models as GGUF files and as Hugging Face checkpoint directories,
with transformers' logits for them.

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

Each model is also saved with ``save_pretrained`` as ``<case>/`` (float32 ``model.safetensors``, config.json in
transformers 5's generation, generation_config.json: Llama 3's lists two EOS ids), with a tokenizer of its own:
the GGUF's byte-level BPE vocabulary and merges as ``tokenizer.json`` (Llama 3's post-processor puts BOS first)
and ``tokenizer_config.json`` naming BOS and EOS. ``qwen2_untied`` is saved in bfloat16 too
(``qwen2_untied_bf16/``). transformers reads each directory back to the same parameters and logits (for bfloat16:
the model's weights rounded to bfloat16, computing in float32), and ``checkpoints.json`` records, per directory,
what its tokenizer and generation config make of a few texts and, for bfloat16, the rounded model's reference (as
reference.json's) and how far the rounding moved the float32 reference's logits.

Run it by hand from the repository root with the reference virtual environment (torch 2.13, transformers
5.25, gguf 0.19; nothing is downloaded)::

    HF_HUB_OFFLINE=1 /work/refvenv/bin/python tests/golden/tiny_archs/make_reference.py

It takes seconds and writes the GGUF files (440-570 kB each), the directories (300-590 kB each),
``reference.json`` and ``checkpoints.json`` beside itself; with the same versions it rewrites the GGUF files and
reference.json byte for byte.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import math
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf
import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    TokenizersBackend,
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


# ---- the checkpoint directory, as transformers saves it ----

BOS, EOS, END_OF_TURN = 1, 0, 2  # <|im_start|>, <|endoftext|>, <|im_end|>: the GGUF's BOS and EOS
SIXTEEN_BIT = {"qwen2_untied": torch.bfloat16}  # also saved in 16 bits, as <case>_bf16
TEXTS = ["hello world", "abc  def\nghi", "naïve café ☕", "<|im_start|>hi<|im_end|> x", "aabbccdd 12345!"]


def is_llama3(case: Case) -> bool:
    return (case.config.rope_parameters or {}).get("rope_type") == "llama3"


def tokenizer_json(case: Case) -> Tokenizer:
    """The GGUF's byte-level BPE (vocabulary and merges) as tokenizer.json; the Llama 3 case's post-processor
    puts BOS first, as Llama 3's does."""
    tokens, _, merges = vocabulary()
    pairs = [tuple(m.split(" ")) for m in merges]
    fast = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[:3]])
    if is_llama3(case):
        fast.post_processor = processors.TemplateProcessing(single=f"{tokens[BOS]} $A",
                                                            special_tokens=[(tokens[BOS], BOS)])
    return fast


def write_checkpoint(case: Case, model: Any, directory: Path, dtype: torch.dtype) -> None:
    """The model as save_pretrained writes it in `dtype` (model.safetensors, config.json, generation_config.json),
    with the tokenizer's files; BOS and EOS the GGUF's, Llama 3's generation config ending at end of turn too."""
    saved = copy.deepcopy(model).to(dtype)
    saved.config.bos_token_id, saved.config.eos_token_id = BOS, EOS
    saved.generation_config = GenerationConfig(bos_token_id=BOS,
                                               eos_token_id=[EOS, END_OF_TURN] if is_llama3(case) else EOS)
    shutil.rmtree(directory, ignore_errors=True)
    saved.save_pretrained(directory)
    tokens = vocabulary()[0]
    TokenizersBackend(tokenizer_object=tokenizer_json(case), bos_token=tokens[BOS],
                      eos_token=tokens[EOS]).save_pretrained(directory)


def rounded(model: Any, dtype: torch.dtype) -> Any:
    """The model with its parameters rounded to `dtype` and computing in float32: what a loader that keeps the
    16-bit weights as stored and multiplies in float32 computes. Only the parameters: model.to(dtype) would round
    the RoPE frequencies (a buffer) too."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for param in out.parameters():
            param.copy_(param.to(dtype).to(torch.float32))
    return out.eval()


@torch.no_grad()
def check_checkpoint(expected: Any, directory: Path) -> dict[str, Any]:
    """transformers reads the directory back as `expected`: every parameter bit for bit (as float32), the same
    logits."""
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    ours, theirs = expected.state_dict(), loaded.state_dict()
    unequal = sorted(set(ours) ^ set(theirs)) or [n for n in ours if not torch.equal(ours[n], theirs[n])]
    if unequal:
        raise SystemExit(f"{directory.name}: transformers reads other parameters back: {unequal}")
    worst = max(float((loaded(input_ids=torch.tensor([ids])).logits
                       - expected(input_ids=torch.tensor([ids])).logits).abs().max()) for ids in PROMPTS.values())
    if worst > 0:
        raise SystemExit(f"{directory.name}: transformers' logits of the directory differ by {worst}")
    return {"parameters_equal": len(ours), "logits_max_abs_diff": worst}


def tokenizer_record(directory: Path) -> dict[str, Any]:
    """What transformers' tokenizer and generation config make of the directory: BOS, EOS, and each text's ids
    (without and with the special tokens the tokenizer adds) and their decoding."""
    tok = AutoTokenizer.from_pretrained(directory)
    generation = GenerationConfig.from_pretrained(directory)
    texts = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True)
        texts.append({"text": text, "ids": tok.encode(text, add_special_tokens=False), "prompt_ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=True),
                      "decoded_with_special": tok.decode(ids, skip_special_tokens=False)})
    return {"tokenizer_class": type(tok).__name__, "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id, "generation_eos_token_id": generation.eos_token_id, "texts": texts}


def max_logit_change(model: Any, other: Any, prompts: dict[str, Any]) -> float:
    """The largest difference of the two models' logits at the positions the test compares with `model`'s
    reference (`prompts`: each prompt's, its greedy tokens after it)."""
    return max(float((positions_logits(other, p["token_ids"], p["greedy"])
                      - positions_logits(model, p["token_ids"], p["greedy"])).abs().max()) for p in prompts.values())


def checkpoint_records(case: Case, model: Any, prompts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """<case>/ in float32 (and <case>_bf16/ where SIXTEEN_BIT says): written, read back by transformers, and for
    16 bits the rounded model's own reference (transformers' float32 logits of the rounded weights) and how far
    the rounding moved the logits of the float32 reference's `prompts`."""
    out = {}
    for suffix, dtype in [("", torch.float32), *(("_bf16", d) for d in [SIXTEEN_BIT.get(case.name)] if d)]:
        directory = HERE / f"{case.name}{suffix}"
        write_checkpoint(case, model, directory, dtype)
        expected = model if dtype == torch.float32 else rounded(model, dtype)
        record: dict[str, Any] = {"of": case.name, "dtype": str(dtype).removeprefix("torch."),
                                  "transformers_check": check_checkpoint(expected, directory),
                                  "tokenizer": tokenizer_record(directory),
                                  "bytes": sum(f.stat().st_size for f in directory.iterdir())}
        if dtype != torch.float32:
            record["float32_logits_max_abs_diff"] = max_logit_change(model, expected, prompts)
            record["prompts"] = {name: record_prompt(expected, ids) for name, ids in PROMPTS.items()}
        out[directory.name] = record
        print(f"  {directory.name}/: {record['bytes']} bytes, {record['dtype']}", flush=True)
    return out


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


def run_case(case: Case, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case's reference record, and its checkpoint directories' records."""
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
    return record, checkpoint_records(case, model, record["prompts"])


def versions() -> dict[str, str]:
    found = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "gguf", "numpy")}
    found["python"] = sys.version.split()[0]
    return found


def main() -> None:
    torch.set_num_threads(1)  # a deterministic reduction order, whatever the host
    runs = {case.name: run_case(case, seed) for seed, case in enumerate(CASES)}
    common = {"versions": versions(), "reference": "transformers, float32, eager attention, CPU",
              "greedy_steps": GREEDY_STEPS}
    write_json(HERE / "reference.json", {**common, "cases": {name: run[0] for name, run in runs.items()}})
    write_json(HERE / "checkpoints.json", {**common, "directories": {
        name: record for run in runs.values() for name, record in run[1].items()}})


def write_json(out: Path, record: dict[str, Any]) -> None:
    # one line per list of numbers: 5 x 3 rows of 512 logits would take 7,680 lines
    text = re.sub(r"\[[-0-9.e,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)), json.dumps(record, indent=1))
    out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
