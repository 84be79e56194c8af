"""The tiny architectures as Hugging Face checkpoint directories (tiny_archs/<case>/, written by make_reference.py
with transformers' save_pretrained; tiny_archs/checkpoints.json holds what transformers made of each): their
weights are their GGUF's bit for bit, Llama 3's RoPE scaling in config.json becomes the GGUF's rope_freqs, a
bfloat16 directory is served as stored and computes what transformers computes from the same rounded weights,
each tokenizer encodes and decodes as transformers' reading of it does, and what the loader cannot serve is
refused in one line. The logits and greedy tokens of the float32 directories: test_tiny_archs.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from safetensors.numpy import load_file, save_file

from backends.model.config import ModelLoadError
from backends.model.loader import LoadedModel, open_model
from backends.model.quant import Matrix, QuantMatrix, dense
from tests.golden.test_tiny_archs import (
    CASES,
    HERE,
    LOGIT_TOL,
    PATHS,
    assert_greedy,
    assert_logits,
    backend_of,
    model_of,
)

CHECKPOINTS = json.loads((HERE / "checkpoints.json").read_text(encoding="utf-8"))["directories"]
FLOAT32 = sorted(name for name, record in CHECKPOINTS.items() if record["dtype"] == "float32")
BF16 = "qwen2_untied_bf16"


def matrices(model: LoadedModel) -> list[Matrix]:
    w = model.weights
    return [w.embedding, w.final_norm, w.lm_head, *(a for layer in w.layers for a in layer.arrays())]


@pytest.mark.parametrize("name", FLOAT32)
def test_a_float32_directory_loads_its_ggufs_floats(name: str) -> None:
    """save_pretrained's tensors and the converter's (Llama's Q/K rows permuted there, on read here) give the same
    floats; the configs differ only in the name and in the RMS epsilon, which the GGUF holds as a float32."""
    ours, gguf = model_of(name, "float32", "checkpoint"), model_of(name, "float32")
    pairs = list(zip(matrices(ours), matrices(gguf), strict=True))
    assert all(np.array_equal(dense(a), dense(b)) for a, b in pairs)
    assert (ours.weights.lm_head is ours.weights.embedding) == CASES[name]["config"]["tie_word_embeddings"]
    assert np.float32(ours.config.rms_eps) == np.float32(gguf.config.rms_eps)
    assert replace(ours.config, name=gguf.config.name, rms_eps=gguf.config.rms_eps) == gguf.config


def _config_copy(tmp_path: Path, name: str, **changes: Any) -> Path:
    """A copy of the directory `name` with config.json's keys changed (None: removed)."""
    directory = tmp_path / name
    shutil.copytree(HERE / name, directory)
    config = {**json.loads((directory / "config.json").read_text()), **changes}
    (directory / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return directory


def _older_generation(rope: dict[str, Any]) -> dict[str, Any]:
    """config.json's RoPE keys as transformers 4 wrote them: rope_theta and rope_scaling at the top level."""
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_parameters": None, "rope_theta": rope["rope_theta"], "rope_scaling": scaling}


@pytest.mark.parametrize("generation", ["rope_parameters", "rope_scaling"])
def test_llama3_rope_scaling_becomes_the_ggufs_rope_freqs(tmp_path: Path, generation: str) -> None:
    """Each RoPE pair's divisor as llama.cpp's converter wrote it into the GGUF, from either generation of
    config.json (the test of the logits fails without them: test_the_llama3_reference_needs_the_rope_scaling)."""
    rope = CASES["llama3_untied"]["config"]["rope_parameters"]
    changes = _older_generation(rope) if generation == "rope_scaling" else {}
    config = open_model(_config_copy(tmp_path, "llama3_untied", **changes))[1].config
    expected = np.asarray(CASES["llama3_untied"]["rope_freqs"], np.float32)
    np.testing.assert_array_equal(np.asarray(config.rope_freq_factors, np.float32), expected)
    assert len(set(config.rope_freq_factors)) == 4  # 1, 8 and two interpolated: every branch of the formula


@pytest.mark.parametrize("generation", ["rope_parameters", "rope_scaling"])
def test_another_rope_scaling_is_refused_in_one_line(tmp_path: Path, generation: str) -> None:
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    changes = _older_generation(rope) if generation == "rope_scaling" else {"rope_parameters": rope}
    with pytest.raises(ModelLoadError) as refused:
        open_model(_config_copy(tmp_path, "llama3_untied", **changes))
    assert "RoPE scaling 'yarn' is not supported (served: default, llama3)" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_bfloat16_directory_is_served_as_stored() -> None:
    """Every matrix kept as BF16 (--weights gguf), none converted."""
    model = model_of(BF16, "gguf", "checkpoint")
    w = model.weights
    stored = [w.embedding, w.lm_head, *(m for layer in w.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up,
                                                                          layer.w_down))]
    assert all(isinstance(m, QuantMatrix) and m.qtype == GGMLQuantizationType.BF16 for m in stored)
    assert w.dequantized == ()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_bfloat16_directory_computes_transformers_logits_of_its_weights(path: str) -> None:
    """Against transformers run in float32 on the same bfloat16-rounded weights (checkpoints.json): float32
    arithmetic on equal operands on both sides, so the float32 directories' tolerance holds; greedy tokens too
    (they part from the float32 model's on the long prompt)."""
    record = CHECKPOINTS[BF16]
    backend = backend_of(BF16, "gguf", path, "checkpoint")
    assert_logits(backend, record["prompts"], LOGIT_TOL)
    assert_greedy(backend, model_of(BF16, "gguf", "checkpoint"), list(record["prompts"].values()))


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_bfloat16_directory_is_the_float32_model_within_its_rounding(path: str) -> None:
    """Against the float32 model's reference. bfloat16 keeps 8 significant bits: each weight moves by at most
    2^-9 of itself. Through two layers and the head that moved transformers' own logits (up to 34) by at most
    `change` (0.090, about 1.35 x 2^-9 x 34: checkpoints.json, over the whole row at every position compared
    here); ours may differ from transformers' by LOGIT_TOL beyond that (measured: 0.069 from the float32
    reference, 5.7e-6 from the rounded one). The bound is no formality: the rounding moves the logits by
    far more than LOGIT_TOL."""
    change = CHECKPOINTS[BF16]["float32_logits_max_abs_diff"]
    assert 10 * LOGIT_TOL < change < 2**-9 * 34 * 2
    assert_logits(backend_of(BF16, "gguf", path, "checkpoint"), CASES["qwen2_untied"]["prompts"],
                  change + LOGIT_TOL)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_the_tokenizer_is_the_directorys(name: str) -> None:
    """BOS, the stop tokens (Llama 3's generation config lists two), and each text's ids, prompt ids (BOS first
    where Llama 3's post-processor puts it) and decoding as transformers gave them; the GGUF of the same
    vocabulary tokenizes alike."""
    record = CHECKPOINTS[name]["tokenizer"]
    tokenizer = open_model(HERE / name)[1].tokenizer
    eos = record["generation_eos_token_id"]
    assert tokenizer.bos_token_id == record["bos_token_id"]
    assert tokenizer.eos_token_ids == tuple(eos if isinstance(eos, list) else [eos])
    gguf = model_of(CHECKPOINTS[name]["of"], "float32").files.tokenizer
    for text in record["texts"]:
        assert tokenizer.encode(text["text"]) == text["ids"] == gguf.encode(text["text"])
        assert tokenizer.encode_prompt(text["text"]) == text["prompt_ids"]
        assert tokenizer.decode(text["prompt_ids"]) == text["decoded"]
        assert tokenizer.decode(text["prompt_ids"], skip_special_tokens=False) == text["decoded_with_special"]


def _tensors_copy(tmp_path: Path, name: str, change: dict[str, np.ndarray | None]) -> Path:
    """A copy of the directory `name` with tensors replaced, added or (None) removed."""
    directory = _config_copy(tmp_path, name)
    tensors = load_file(directory / "model.safetensors")
    tensors = {n: t for n, t in {**tensors, **change}.items() if t is not None}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


BIAS = "model.layers.0.self_attn.{}_proj.bias"


@pytest.mark.parametrize(("name", "change", "message"), [
    ("qwen2_tied", {BIAS.format("k"): np.zeros(16, np.float32)}, f"{BIAS.format('k')} has shape [16], config.json "
                                                                  "implies [32]"),
    ("qwen2_tied", {BIAS.format("v"): None}, f"{BIAS.format('v')} is missing"),
    ("qwen3", {BIAS.format("q"): np.zeros(128, np.float32)}, f"{BIAS.format('q')} has no place in qwen3"),
    ("mistral", {BIAS.format("q"): np.zeros(64, np.float32)}, f"{BIAS.format('q')} has no place in llama"),
])
def test_biases_are_checked_against_the_architecture(tmp_path: Path, name: str, change: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ModelLoadError) as refused:
        open_model(_tensors_copy(tmp_path, name, change))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_mistral_sliding_window_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as refused:
        open_model(_config_copy(tmp_path, "mistral", sliding_window=64))
    assert "a sliding window (64 positions) is not supported for llama" in str(refused.value)
