"""GGUF loading: config, dequantization, and clear errors for files we cannot serve."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from backends.model.config import ModelLoadError
from backends.model.gguf_file import read_gguf
from backends.model.loader import LoadedModel, load_model, open_model
from backends.model.quant import Matrix, QuantMatrix, as_q8_0
from backends.model.weights import ModelWeights, dequantize
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.weights import STORED_TYPES
from tests.backends.tiny_gguf import TOKENS, write_tiny_llama


def test_default_model_config_matches_smollm2() -> None:
    _, files = open_model()
    cfg = files.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.context_length) == (49152, 1536, 8192)
    assert cfg.rope_theta == 100000.0 and cfg.rms_eps == pytest.approx(1e-5)
    assert cfg.bos_token_id == 1 and 2 in cfg.eos_token_ids


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_each_supported_type_dequantizes_to_float32(tmp_path: Path, qtype: Q) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=qtype)
    model = load_model(path)
    w = model.weights.layers[0].w_down
    assert w.dtype == np.float32 and w.shape == (64, 128)
    raw = read_gguf(path)
    expected = quants.dequantize(raw.raw("blk.0.ffn_down.weight"), qtype).reshape(64, 128)
    np.testing.assert_array_equal(dequantize(raw, "blk.0.ffn_down.weight"), expected)


def test_quantization_error_is_within_the_types_precision(tmp_path: Path) -> None:
    exact = load_model(write_tiny_llama(tmp_path / "f32.gguf", weight_type=Q.F32)).weights.layers[1].wo
    q8 = load_model(write_tiny_llama(tmp_path / "q8.gguf", weight_type=Q.Q8_0)).weights.layers[1].wo
    # Q8_0 rounds each value to a step of its block's max / 127 (the step a float16): at most half a step off
    assert np.abs(exact - q8).max() <= np.abs(exact).max() / 254 * (1 + 2.0**-10)


def test_tiny_model_loads_any_llama_gguf(tmp_path: Path) -> None:
    model = load_model(write_tiny_llama(tmp_path / "tiny.gguf"))
    assert model.config.num_layers == 2 and model.config.head_dim == 16
    assert model.weights.lm_head is model.weights.embedding  # no output.weight: tied


def _cli_error(args: list[str]) -> subprocess.CompletedProcess[str]:
    code = "import sys; from service.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["missing", "not_gguf", "unsupported_arch", "truncated"])
def test_unservable_files_give_one_clear_error(tmp_path: Path, case: str) -> None:
    path = tmp_path / "model.gguf"
    if case == "not_gguf":
        path.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    elif case == "unsupported_arch":
        write_tiny_llama(path, arch="mamba")
    elif case == "truncated":
        path.write_bytes(write_tiny_llama(tmp_path / "full.gguf").read_bytes()[:200])
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    result = _cli_error(["generate", "--model", str(path), "--prompt", "hi"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0
    assert result.stdout == ""


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=Q.F32)
    data = bytearray(path.read_bytes())
    raw = read_gguf(path)
    info = raw.tensors["blk.1.ffn_up.weight"]
    # Rewrite that tensor's type field to I64 (same 8-byte element size as 2 x F32 would need: shape halves).
    name = b"blk.1.ffn_up.weight"
    at = data.index(name) + len(name) + 4 + 8 * len(info.shape)
    data[at : at + 4] = int(Q.I32).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight.*I32"):
        load_model(path)


def test_default_model_loads_quickly_enough_to_report(real_model: LoadedModel) -> None:
    model = real_model  # the session's load_model()
    assert model.load_seconds > 0 and model.weights.num_bytes > 500e6  # float32, about 538 MB


def _matrices(weights: ModelWeights) -> list[Matrix]:
    return [weights.embedding, weights.lm_head, *(getattr(layer, name) for layer in weights.layers
                                                  for name in ("wqkv", "wo", "w_gate_up", "w_down"))]


def test_the_default_model_kept_as_stored_makes_no_float32_copy(real_model_stored: LoadedModel) -> None:
    model = real_model_stored  # the session's load_model(stored=STORED_TYPES)
    assert all(isinstance(m, QuantMatrix) for m in _matrices(model.weights)) and not model.weights.dequantized
    assert model.weights.num_bytes < 100e6  # 97 MB as stored (538 MB as float32)
    assert {m.qtype for m in _matrices(model.weights)} == {Q.Q4_1, Q.Q8_0}
    float_arrays = [a for layer in model.weights.layers for a in vars(layer).values() if isinstance(a, np.ndarray)]
    assert all(a.ndim == 1 for a in float_arrays)  # the norms only


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_stored_matrices_are_the_files_bytes(tmp_path: Path, qtype: Q) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", weight_type=qtype)
    weights, raw = load_model(path, stored=STORED_TYPES).weights, read_gguf(path)
    assert isinstance(weights.layers[0].w_down, QuantMatrix) and weights.layers[0].w_down.qtype == qtype
    np.testing.assert_array_equal(weights.layers[0].w_down.data, raw.raw("blk.0.ffn_down.weight").reshape(64, -1))
    np.testing.assert_array_equal(weights.layers[1].wqkv.dequantize(), np.concatenate(  # type: ignore[union-attr]
        [dequantize(raw, f"blk.1.attn_{p}.weight") for p in "qkv"]))


def test_a_type_without_a_kernel_is_dequantized_and_named(tmp_path: Path) -> None:
    types = {"blk.0.ffn_down.weight": Q.MXFP4, "blk.1.attn_v.weight": Q.Q4_1}  # MXFP4: no kernel reads it
    weights = load_model(write_tiny_llama(tmp_path / "tiny.gguf", types=types), stored=STORED_TYPES).weights
    assert isinstance(weights.layers[0].w_down, np.ndarray) and isinstance(weights.layers[1].wqkv, np.ndarray)
    assert isinstance(weights.layers[1].w_down, QuantMatrix)
    # Q4_1's d * q + m has no Q8_0 spelling: the mixed QKV is a float32 copy
    assert weights.dequantized == ("blk.0.ffn_down.weight (MXFP4)", "blk.1.attn_qkv (mixed Q8_0/Q8_0/Q4_1)")


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q5_0, Q.Q8_0])
def test_q4_0_and_q5_0_become_q8_0_with_every_value_unchanged(qtype: Q) -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(0, 1, (24, 256)) * rng.choice([1e-3, 1, 300], (24, 1))  # scales near and far apart
    values[0, :32] = 0  # a block of zeros: d is 0
    values[1, :32] = np.linspace(-1, 1, 32)  # every integer of the block's range, both ends
    stored = QuantMatrix.quantize(values, qtype)
    widened = as_q8_0(stored)
    assert widened is not None and widened.qtype == Q.Q8_0 and widened.shape == stored.shape
    np.testing.assert_array_equal(widened.dequantize(), stored.dequantize())  # gguf's values, bit for bit


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q6_K, Q.F16])
def test_types_that_q8_0_cannot_spell_are_not_widened(qtype: Q) -> None:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    assert as_q8_0(QuantMatrix(qtype, (2, 256), np.zeros((2, 256 // block * block_bytes), np.uint8))) is None


def test_mixed_q5_0_and_q8_0_qkv_stacks_as_stored_q8_0(tmp_path: Path) -> None:
    """Gemma 3's layers: Q5_0 Q and K beside a Q8_0 V stay one stored matrix (no float32 copy), and it gives
    the file's values."""
    types = {f"blk.1.attn_{p}.weight": Q.Q5_0 for p in "qk"}
    path = write_tiny_llama(tmp_path / "tiny.gguf", types=types)
    weights, raw = load_model(path, stored=STORED_TYPES).weights, read_gguf(path)
    wqkv = weights.layers[1].wqkv
    assert isinstance(wqkv, QuantMatrix) and wqkv.qtype == Q.Q8_0 and not weights.dequantized
    np.testing.assert_array_equal(wqkv.dequantize(), np.concatenate(
        [dequantize(raw, f"blk.1.attn_{p}.weight") for p in "qkv"]))


def test_the_backend_says_once_which_matrices_are_float32_copies(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    types = {f"blk.{i}.ffn_down.weight": Q.MXFP4 for i in range(2)}
    model = load_model(write_tiny_llama(tmp_path / "tiny.gguf", types=types), stored=STORED_TYPES)
    with caplog.at_level(logging.WARNING):
        NumpyBackend(model, "numpy")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 weight matrices are float32 copies" in warnings[0] and "2 x MXFP4" in warnings[0]


def test_string_arrays_read_as_the_files_strings(tmp_path: Path) -> None:
    """GGUF string arrays stay packed (gguf_file.StringArray) and read as the strings written."""
    tokens = read_gguf(write_tiny_llama(tmp_path / "tiny.gguf")).metadata["tokenizer.ggml.tokens"]
    assert list(tokens) == TOKENS and len(tokens) == len(TOKENS) and tokens[-1] == TOKENS[-1]
    assert tokens[2:5] == TOKENS[2:5]
    with pytest.raises(IndexError):
        tokens[len(TOKENS)]
