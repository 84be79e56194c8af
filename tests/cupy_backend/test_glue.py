"""The GPU-only glue that runs without a GPU: the NVRTC source, kernel-module compilation with its fallback,
argument conversion for RawKernel, and the step's few host-to-device transfers."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from backends.base import BackendError
from backends.config import BackendConfig
from backends.cupy_backend import create, launch, source
from backends.cupy_backend import device as device_module
from backends.cupy_backend.backend import SUPPORTED_FEATURES, CupyBackend, _check_supported
from backends.cupy_backend.device import Device
from backends.cupy_backend.launcher import CupyLauncher, compile_module
from backends.cupy_backend.quant_weights import DeviceQuant, stored_types, upload_matrix
from backends.cupy_backend.step_inputs import upload_sampling, upload_step
from backends.cupy_backend.storage import storage_for
from backends.manual_batch import SeqState, make_batch
from backends.model.architecture import ARCHITECTURES
from backends.model.loader import load_model, open_model
from backends.model.quant import QuantMatrix
from tests.backends.tiny_gguf import write_tiny_llama
from tests.cupy_backend.fakes import DeviceArray, device, fake_cupy
from tests.cupy_backend.tiny_model import (
    QUANT_TYPES,
    SHAPE,
    write_tiny_gemma3_d256,
    write_tiny_llama_d64,
    write_tiny_llama_d64_quant,
)


def test_module_source_inlines_each_local_header_once() -> None:
    text = source.module_source()
    assert not re.search(r'^\s*#\s*include\s+"', text, re.M), "a local include was left for NVRTC to resolve"
    assert "#pragma once" not in text
    assert text.count("constexpr int kWarpSize = 32;") == 1  # common.cuh
    assert text.count("struct KvLayout") == 1  # attention_common.cuh
    for path in source.kernel_sources():
        assert text.count(f"// ---- {path.name}\n") == 1
    # the dequantizing kernels' names are built per type by PS_FOR_EACH_QUANT: the kernel's macro and the type's entry
    bases = "quant_gemv_logits|quant_gemv|quant_gemm_logits|quant_gemm|dequantize"
    quant = re.compile(rf"^({bases})_({'|'.join(launch.QUANT_TYPES)})$")
    for name in launch.all_kernel_names():  # every name is spelled out or built by a PS_DEFINE_* macro
        base = re.sub(r"_(f32|f16|bf16)(_d\d+)?(_b\d+)?$", "", name)
        match = quant.match(base)
        if match:
            assert f" {match[1]}_##NAME##_##SUFFIX" in text and f"X({match[2]}, " in text, name
        else:
            assert f" {base}_##SUFFIX" in text, name


def cuda_headers(include: Path) -> Path:
    include.mkdir(parents=True, exist_ok=True)
    for header in ("cuda_fp16.h", "cuda_bf16.h"):
        (include / header).write_text("")
    return include


@pytest.fixture
def no_toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No toolkit named by the environment, and the default one moved to an empty folder: a CUDA toolkit on the
    machine that runs the tests would otherwise win, and the wheel search would go unchecked."""
    for var in source.TOOLKIT_ROOTS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(source, "DEFAULT_TOOLKIT", tmp_path / "no-toolkit")


@pytest.mark.usefixtures("no_toolkit")
def test_cuda_include_dirs_finds_a_wheel_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    include = tmp_path / "site" / "nvidia" / "cu13" / "include"
    include.mkdir(parents=True)
    assert source.cuda_include_dirs([str(tmp_path / "site")]) == []  # the folder without the headers is passed by
    cuda_headers(include)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "none"))  # a toolkit named but missing is passed by too
    assert source.cuda_include_dirs([str(tmp_path / "site")]) == [str(include)]
    assert source.nvrtc_options([str(include)])[-1] == f"-I{include}"


def test_nvrtc_tries_its_own_headers_then_the_toolkits_then_no_tensor_cores() -> None:
    plain, toolkit, cores_off = source.option_sets(["/cuda/include"])
    assert toolkit == (*plain, "-I/cuda/include") and cores_off == (*toolkit, source.NO_TENSOR_CORES)
    assert source.tensor_cores(plain) and source.tensor_cores(toolkit) and not source.tensor_cores(cores_off)
    assert source.option_sets([]) == [plain, (*plain, source.NO_TENSOR_CORES)]
    text = source.module_source()  # the GEMM includes <mma.h> unless told not to: a missing one fails the build
    guard = "#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PS_NO_TENSOR_CORES)\n"
    assert guard + "#include <mma.h>" in text


@pytest.mark.usefixtures("no_toolkit")
def test_a_toolkit_wins_over_the_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_headers(tmp_path / "site" / "nvidia" / "cu13" / "include")
    default = cuda_headers(tmp_path / "no-toolkit" / "include")
    assert source.cuda_include_dirs([str(tmp_path / "site")]) == [str(default)]
    named = cuda_headers(tmp_path / "named" / "include")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "named"))
    assert source.cuda_include_dirs([str(tmp_path / "site")]) == [str(named)]


class FakeKernel:
    """A RawKernel: called with the launch, and its dynamic shared memory limit settable (0: the default)."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name, self.calls = name, calls
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], shared_mem: int) -> None:
        assert shared_mem <= max(launch.DEFAULT_SHARED_MEM, self.max_dynamic_shared_size_bytes), "not opted in"
        self.calls.append((self.name, grid, block, args, shared_mem))


class FakeModule:
    def __init__(self, code: str, options: tuple[str, ...], fail_unless: str | None = None) -> None:
        self.options, self.fail_unless = options, fail_unless
        self.calls: list[tuple[Any, ...]] = []

    def get_function(self, name: str) -> Any:
        if self.fail_unless is not None and self.fail_unless not in " ".join(self.options):
            raise RuntimeError("catastrophic error: cannot open source file \"cuda_bf16.h\"")
        return FakeKernel(name, self.calls)


def test_compile_module_falls_back_to_the_next_option_set() -> None:
    cupy = fake_cupy(RawModule=lambda code, options: FakeModule(code, options, fail_unless="-I/cuda"))
    module, options = compile_module(cupy, "src", [("--std=c++17",), ("--std=c++17", "-I/cuda")], ["k"])
    assert options == ("--std=c++17", "-I/cuda") and isinstance(module, FakeModule)


def test_compile_module_reports_every_attempt() -> None:
    cupy = fake_cupy(RawModule=lambda code, options: FakeModule(code, options, fail_unless="never"))
    with pytest.raises(RuntimeError, match="cuda_bf16.h") as info:
        compile_module(cupy, "src", [("-a",), ("-b",)], ["k"])
    assert "('-a',)" in str(info.value) and "('-b',)" in str(info.value)


def test_launcher_passes_exact_scalar_types_and_device_pointers() -> None:
    module = FakeModule("", ())
    launcher = CupyLauncher(fake_cupy(), module)
    spec = launch.rms_norm("float16", 3, 200)
    x = device(np.zeros((3, 200), np.float16))
    launcher.launch(spec, [x, x, x, 1e-5, 200])
    name, grid, block, args, smem = module.calls[0]
    assert (name, grid, block, smem) == (spec.name, spec.grid, spec.block, spec.shared_mem)
    assert isinstance(args[0], DeviceArray) and type(args[3]) is np.float32 and type(args[4]) is np.int32
    with pytest.raises(TypeError, match="device array"):
        launcher.launch(spec, [np.zeros(3), x, x, 1e-5, 200])
    with pytest.raises(TypeError, match="takes 5 arguments"):
        launcher.launch(spec, [x, x, 1e-5, 200])


def test_launcher_opts_a_kernel_into_more_than_48k_of_shared_memory() -> None:
    """The prefill kernel at head_dim 256 needs more than the default dynamic shared memory."""
    module = FakeModule("", ())
    launcher = CupyLauncher(fake_cupy(), module)
    x = device(np.zeros(4, np.float32))
    for head_dim in (128, 256):
        spec = launch.paged_prefill_attention("float32", head_dim, 1, 2, 1, 5)
        launcher.launch(spec, [x, x, x, x, x, x, x, 0.1, 1, 1, 16, 4, 0])
        assert launcher.kernel(spec.name).max_dynamic_shared_size_bytes == (spec.shared_mem if head_dim == 256 else 0)
    assert len(module.calls) == 2 and module.calls[1][4] > launch.DEFAULT_SHARED_MEM


class CountingXp:
    """numpy, counting host-to-device copies."""

    def __init__(self) -> None:
        self.transfers = 0

    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        self.transfers += 1
        return np.array(a, dtype=dtype)


def test_step_arrays_travel_in_two_transfers() -> None:
    seqs = [SeqState(blocks=[3, 1]), SeqState(blocks=[2])]
    batch = make_batch(seqs, [[5, 6, 7], [8]], 4)
    batch = make_batch(seqs, [[9], [10, 11]], 4)
    xp = CountingXp()
    step = upload_step(xp, batch)
    assert xp.transfers == 2
    for name in ("token_ids", "positions", "query_start", "context_lens", "block_tables", "slot_mapping"):
        np.testing.assert_array_equal(getattr(step, name), getattr(batch, name))
    assert step.token_ids.dtype == np.int32 and step.slot_mapping.dtype == np.int64
    assert step.sample_rows.tolist() == [0, 2]  # the last token row of each sampled sequence
    assert (step.num_tokens, step.num_seqs, step.max_query_len, step.max_context_len) == (3, 2, 2, 4)
    assert not step.decode_only
    assert batch.sampling is not None
    params = upload_sampling(xp, batch.sampling)
    assert xp.transfers == 4 and params.presence_penalty is None
    assert params.top_k.dtype == np.int64 and params.temperature.dtype == np.float32


def test_unsupported_head_dim_is_refused_with_the_reason(tmp_path: Path) -> None:
    model = load_model(write_tiny_llama(tmp_path / "d16.gguf"))  # head_dim 16
    with pytest.raises(BackendError, match="head_dim"):
        CupyBackend(model.config, model.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))


def test_every_feature_the_numpy_forward_computes_is_computed() -> None:
    """No architecture's feature (nor Llama 3's RoPE factors) is refused: the CuPy backend follows the same
    description as the NumPy forward."""
    named = {f for arch in ARCHITECTURES.values() for f in arch.features} | {"RoPE frequency factors"}
    assert named <= SUPPORTED_FEATURES


def test_a_feature_it_lacks_is_refused_in_one_line(tmp_path: Path) -> None:
    model = load_model(write_tiny_gemma3_d256(tmp_path / "gemma3.gguf"))
    CupyBackend(model.config, model.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))  # accepted
    with pytest.raises(BackendError, match=r"^the cupy backend does not compute gemma3's GeGLU, QK norm \(.*\); "
                                           r"use --backend numpy$"):
        _check_supported(model.config, SUPPORTED_FEATURES - {"GeGLU", "QK norm"})


def test_a_gpu_without_the_prefill_tiles_shared_memory_is_refused_at_start_up(tmp_path: Path) -> None:
    """head_dim 256's prefill tiles need 82 KB of shared memory, which a kernel must opt into: a device that
    allows less (compute capability 6.x: 48 KB) is refused before any weight is uploaded, naming both."""
    model = load_model(write_tiny_gemma3_d256(tmp_path / "gemma3.gguf"))

    def on(limit: int) -> Device:
        return Device(xp=np, launcher=CupyLauncher(fake_cupy(), None), name="GPU", shared_mem_per_block=limit)

    with pytest.raises(BackendError, match=r"^GPU gives a kernel at most 48 KB of shared memory; the prefill "
                                           r"attention at head_dim 256 needs 82 KB \(.*\); use --backend numpy$"):
        CupyBackend(model.config, model.weights, on(48 * 1024))
    CupyBackend(model.config, model.weights, on(227 * 1024))  # an A100's or H100's: accepted
    llama = load_model(write_tiny_llama_d64(tmp_path / "d64.gguf"))
    CupyBackend(llama.config, llama.weights, on(48 * 1024))  # head_dim 64's tiles fit the default


def test_positions_past_the_context_length_are_refused(tmp_path: Path) -> None:
    model = load_model(write_tiny_llama_d64(tmp_path / "d64.gguf"))  # context length 256
    backend = CupyBackend(model.config, model.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    backend.init_cache(40, 8)
    seq = SeqState(blocks=list(range(1, 34)), tokens=[3] * 256)
    with pytest.raises(BackendError, match="past the model's context length 256"):
        backend.execute(make_batch([seq], [[4]], 8))


def test_a_window_pool_is_for_sliding_layers_only(tmp_path: Path) -> None:
    """kv_geometry reports a model's sliding layers, which alone may have a pool of their own; a step must bring
    that pool's tables and slots exactly when the cache has it."""
    model = load_model(write_tiny_llama_d64(tmp_path / "d64.gguf"))
    backend = CupyBackend(model.config, model.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    assert backend.kv_geometry.window_layers == 0
    with pytest.raises(BackendError, match="^a window pool of 8 blocks for a model without sliding layers$"):
        backend.init_cache(40, 8, window_blocks=8)
    gemma = load_model(write_tiny_gemma3_d256(tmp_path / "gemma3.gguf"))
    backend = CupyBackend(gemma.config, gemma.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    assert (backend.kv_geometry.window_layers, backend.kv_geometry.sliding_window) == (5, 16)
    backend.init_cache(40, 8, window_blocks=12)
    assert backend.cache.data.shape[:3] == (1, 2, 40) and backend.cache.window_data.shape[:3] == (5, 2, 12)
    assert backend.cache.keys(5).shape[0] == 40 and backend.cache.keys(4).shape[0] == 12
    seq = SeqState(blocks=[1, 2])
    with pytest.raises(BackendError, match="^the KV cache has a window pool, but the step brings no window tables"):
        backend.execute(make_batch([seq], [[4, 5]], 8))
    one = CupyBackend(gemma.config, gemma.weights, Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    one.init_cache(40, 8)
    placed = replace(make_batch([SeqState(blocks=[1])], [[4]], 8), window_block_copies=((1, 2),))
    with pytest.raises(BackendError, match="^the KV cache has no window pool, but the step brings window_block_copi"):
        one.execute(placed)


@pytest.mark.parametrize("weights", ["gguf", "float32"])
def test_create_hands_quantized_matrices_over_as_stored(weights: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """weights = gguf: Q4_0 / Q4_1 / Q8_0 matrices reach the device as their blocks, F16 dense in the dtype;
    weights = float32: every matrix dense in the dtype, as before."""
    monkeypatch.setattr(device_module, "cupy_device", lambda: Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    _, files = open_model(write_tiny_llama_d64_quant(tmp_path / "q.gguf"))
    backend = create(BackendConfig(name="cupy", dtype="float16", weights=weights), files)
    w = backend.weights
    matrices = [w.embedding, w.layers[0].wqkv, w.layers[0].w_down, w.layers[1].wo]
    if weights == "float32":
        assert all(isinstance(m, np.ndarray) and m.dtype == np.float16 for m in matrices)
        return
    assert [getattr(m, "qtype", None) for m in matrices] == ["q8_0", "q4_1", "q4_0", None]
    assert w.lm_head is w.embedding and w.layers[1].wo.dtype == np.float16
    assert w.layers[0].wqkv.data.dtype == np.uint8 and isinstance(w.layers[0].w_gate_up, DeviceQuant)


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.MXFP4, Q.TQ1_0], ids=lambda q: q.name)
def test_a_type_no_kernel_reads_is_uploaded_dense(qtype: Q) -> None:
    """Never kept as stored for this backend; handed over as stored anyway, it goes up dense, as gguf's values
    (random bytes: NaN where gguf makes NaN, which assert_array_equal matches)."""
    assert qtype not in stored_types()
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(0).integers(0, 256, (5, 2 * block_bytes), dtype=np.uint8)
    matrix = QuantMatrix(qtype, (5, 2 * block), data)
    uploaded = upload_matrix(np, storage_for("float32"), matrix)
    assert not isinstance(uploaded, DeviceQuant) and uploaded.dtype == np.float32
    np.testing.assert_array_equal(uploaded, matrix.dequantize())


def test_create_names_the_matrices_no_kernel_reads_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A TQ1_0 matrix (a type gguf writes and no kernel reads) is dequantized by the loader, said at start-up,
    and uploaded dense; the model still runs on the kernels for the rest."""
    monkeypatch.setattr(device_module, "cupy_device", lambda: Device(xp=np, launcher=CupyLauncher(fake_cupy(), None)))
    types = {**QUANT_TYPES, "blk.0.ffn_down.weight": Q.TQ1_0}
    _, files = open_model(write_tiny_llama(tmp_path / "tq.gguf", weight_type=Q.Q4_1, shape=SHAPE, types=types))
    with caplog.at_level(logging.WARNING, logger="backends.cupy_backend"):
        backend = create(BackendConfig(name="cupy", dtype="float16", weights="gguf"), files)
    warnings = [r.getMessage() for r in caplog.records if "no kernel" in r.getMessage()]
    assert len(warnings) == 1 and "blk.0.ffn_down.weight (TQ1_0)" in warnings[0], caplog.text
    w = backend.weights
    assert isinstance(w.layers[0].w_down, np.ndarray) and w.layers[0].w_down.dtype == np.float16
    assert isinstance(w.layers[1].w_down, DeviceQuant) and w.layers[1].w_down.qtype == "q4_1"
