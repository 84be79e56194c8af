"""Llama 3 (RoPE scaling, untied head), Mistral, Qwen2 (QKV biases, tied and untied) and Qwen3 (QK norm, head_dim
apart from hidden / heads), each as a GGUF file and as a Hugging Face checkpoint directory, against an
independent implementation: tiny random models that transformers built and ran in float32
(tiny_archs/reference.json, written with the GGUF files and the directories by tiny_archs/make_reference.py,
which also checks that transformers reads each file and directory back as the model it saved). Each is served by
the NumPy backend through the NumPy reference forward and through the fused C step, with the weights as stored
and as float32 copies (--weights float32; both formats are float32, so the two load the same floats): logits of
every generated position, and greedy continuations token for token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.base import BackendError
from backends.cupy_backend.backend import CupyBackend
from backends.cupy_backend.device import Device
from backends.cupy_backend.launcher import CupyLauncher
from backends.manual_batch import SeqState, make_batch
from backends.model.config import ModelLoadError
from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.weights import STORED_TYPES
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from tests.backends.tiny_gguf import write_tiny_llama
from tests.cupy_backend.fakes import fake_cupy

HERE = Path(__file__).parent / "tiny_archs"
REFERENCE = json.loads((HERE / "reference.json").read_text(encoding="utf-8"))
CASES = REFERENCE["cases"]
BLOCK = 16
# Logits here reach 34. PyTorch sums in its order, we in ours (BLAS, or the C kernels' 8-lane sums and fused
# multiply-adds), and its RoPE angles are float32 products (ours float64, rounded once). Measured (2-core AMD EPYC,
# AVX2), over every case, prompt and position: at most 1.8e-5 on the NumPy path, 1.9e-5 in the fused C step
# (Qwen's logits, the largest); 5x that.
LOGIT_TOL = 1e-4
MARGIN_FLOOR = 2 * LOGIT_TOL  # a greedy step closer than this to a tie may flip between two float32 implementations
PATHS = {"numpy": "numpy", "fused C step": "native"}  # cpu_kernels
WEIGHTS = {"gguf": STORED_TYPES, "float32": ()}  # --weights: as stored where a kernel reads the type, or float32
FORMATS = ("gguf", "checkpoint")  # <case>.gguf, or the directory <case>/ that save_pretrained wrote


def model_path(name: str, fmt: str) -> Path:
    """A case's GGUF, or a directory of checkpoints.json (the cases' own, and the 16-bit one)."""
    return HERE / (CASES[name]["gguf"] if fmt == "gguf" else name)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, CASES[request.param]


_models: dict[tuple[str, str, str], LoadedModel] = {}


def model_of(name: str, weights: str, fmt: str = "gguf") -> LoadedModel:
    if (name, weights, fmt) not in _models:
        _models[name, weights, fmt] = load_model(model_path(name, fmt), stored=WEIGHTS[weights])
    return _models[name, weights, fmt]


def backend_of(name: str, weights: str, path: str, fmt: str = "gguf") -> NumpyBackend:
    backend = NumpyBackend(model_of(name, weights, fmt), cpu_kernels=PATHS[path])
    assert (backend.forward.fused_step is not None) == (path == "fused C step")  # the path asked for runs
    backend.init_cache(32, BLOCK)
    return backend


def positions_logits(backend: NumpyBackend, ids: list[int], generated: list[int]) -> np.ndarray:
    """Logits of the positions that predict each generated token: the prompt's prefill, then one decode step per
    generated token fed back."""
    seq = SeqState(blocks=list(range(-(-(len(ids) + len(generated)) // BLOCK))))
    rows = [backend.compute_logits(make_batch([seq], [ids], BLOCK))[0]]
    rows += [backend.compute_logits(make_batch([seq], [[token]], BLOCK))[0] for token in generated[:-1]]
    return np.stack(rows)


def decided(margins: list[float]) -> int:
    """How many of the reference's greedy tokens no near-tie could flip."""
    return next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(margins))


def assert_logits(backend: NumpyBackend, prompts: dict[str, Any], tol: float) -> None:
    """The whole row at each prompt's last position, and the reference's ten best at every generated one."""
    for prompt in prompts.values():
        logits = positions_logits(backend, prompt["token_ids"], prompt["greedy"])
        np.testing.assert_allclose(logits[0], prompt["last_prompt_logits"], atol=tol, rtol=0)
        for row, top in zip(logits, prompt["top10"], strict=True):
            np.testing.assert_allclose(row[top["ids"]], top["logits"], atol=tol, rtol=0)


def assert_greedy(backend: NumpyBackend, model: LoadedModel, prompts: list[dict[str, Any]]) -> None:
    """All prompts at once through the engine (prefill chunks beside decodes, rows beside rows): the reference's
    greedy tokens up to its first near-tie."""
    llm = LLM(SchedulerConfig(), PagedKVCacheManager(32, BLOCK), backend, model.files.tokenizer, max_model_len=256)
    outs = llm.generate([p["token_ids"] for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=REFERENCE["greedy_steps"], ignore_eos=True))
    for out, prompt in zip(outs, prompts, strict=True):
        sure = decided(prompt["margins"])
        assert sure >= 8  # the comparison is not vacuous
        assert list(out.choices[0].token_ids)[:sure] == prompt["greedy"][:sure]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_logits_are_the_references(case: tuple[str, dict[str, Any]], path: str, weights: str, fmt: str) -> None:
    name, record = case
    assert_logits(backend_of(name, weights, path, fmt), record["prompts"], LOGIT_TOL)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_greedy_continuations_are_the_references(case: tuple[str, dict[str, Any]], path: str, weights: str,
                                                 fmt: str) -> None:
    name, record = case
    assert_greedy(backend_of(name, weights, path, fmt), model_of(name, weights, fmt),
                  list(record["prompts"].values()))


def test_the_files_say_what_each_model_has() -> None:
    """The loader reads each feature from the file: head_dim from key_length, the head tied or not, the RoPE
    factors from rope_freqs, the biases of every layer."""
    shapes = {name: model_of(name, "float32") for name in CASES}
    assert shapes["qwen3"].config.head_dim == 32 != shapes["qwen3"].config.hidden_size // 4
    for name, model in shapes.items():
        untied = not CASES[name]["config"]["tie_word_embeddings"]
        assert (model.weights.lm_head is not model.weights.embedding) == untied
        assert all((layer.qkv_bias is not None) == (name.startswith("qwen2")) for layer in model.weights.layers)
    factors = shapes["llama3_untied"].config.rope_freq_factors
    np.testing.assert_array_equal(factors, np.float32(CASES["llama3_untied"]["rope_freqs"]))
    assert min(factors) == 1 and max(factors) == 8  # fast pairs unscaled, slow ones 8x slower, some between


def test_the_llama3_reference_needs_the_rope_scaling() -> None:
    """Plain RoPE on the same weights gives other greedy tokens within the decided prefix: the tests above would
    fail with rope_freqs ignored."""
    record = CASES["llama3_untied"]
    parted = []
    for name, prompt in record["prompts"].items():
        plain = record["without_rope_scaling"][name]
        first = next((i for i, (a, b) in enumerate(zip(prompt["greedy"], plain, strict=True)) if a != b), None)
        parted.append(first is not None and first < decided(prompt["margins"]))
    assert all(parted)


@pytest.mark.parametrize("name", ["llama3_untied", "qwen2_tied", "qwen3"])
def test_the_cupy_backend_refuses_only_these_head_sizes(name: str) -> None:
    """Their features (RoPE factors, QKV biases, QK norm) the CuPy backend computes (tests/cupy_backend's emulated
    scenarios check each against the NumPy forward); these tiny files' heads of 16 and 32 have no attention
    kernels, which it says at start-up in one line."""
    model = model_of(name, "float32")
    with pytest.raises(BackendError, match=r"^the cupy backend's attention kernels support head_dim \(.*\), not "
                                           r"(16|32) \(.*\)$") as info:
        CupyBackend(model.config, model.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    assert "\n" not in str(info.value)


def test_a_qwen2_file_without_its_biases_is_refused_in_one_line(tmp_path: Path) -> None:
    """The architecture says which tensors a layer has: a qwen2 file with Llama's layer is refused at load."""
    path = write_tiny_llama(tmp_path / "qwen2.gguf", arch="qwen2")
    with pytest.raises(ModelLoadError, match=r"^.*qwen2\.gguf: tensor 'blk\.0\.attn_q\.bias' is missing$"):
        load_model(path)
