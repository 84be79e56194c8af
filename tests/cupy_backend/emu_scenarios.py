"""End-to-end scenarios: CupyBackend on the CPU emulation against NumpyBackend on the same tiny model, fed the
same StepBatches. Each runs in a child process (emu_run.py), since an emulated kernel can crash or hang.

float32 must match to float32 rounding (logits within 1e-4, identical greedy tokens); float16 and bfloat16
only to their precision, which checks that the 16-bit storage flows through every kernel and GEMM. The quant-*
scenarios do the same on the model quantized like the default one, each backend reading the matrices as the
file stores them: decode rows through the dequantizing GEMV, prefill chunks through a dense copy and the GEMM.
The k-quant-* scenarios do it again on a wider model whose matrices are Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and
Q6_K (the head and embedding Q6_K). checkpoint-bfloat16 serves the tiny model from a Hugging Face checkpoint
directory of bfloat16 matrices. A scenario dry-runs bench/gpu_check.py's measurement sections on the
emulated device. The graphs-* scenarios replay decode steps from captured graphs (emu_graph_scenarios.py).
The gemma3-* scenarios run the same steps on a tiny Gemma 3 (tiny_model.py: head_dim 256, RoPE over head halves
with a base per layer, QK and sandwich norms, GeGLU, scaled embeddings, five layers sliding over a window of 16
that the contexts outgrow), checking first that the window changes the reference's logits by far more than the
tolerance, so an ignored window fails; gemma3-parts8 splits even the sliding layers' windows into partitions.
The qwen2-*, qwen3-* and llama3-* scenarios do it on the tiny head_dim-64 model with Qwen2's QKV biases, Qwen3's
QK norms (both RoPE over head halves) and Llama 3's RoPE frequency factors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from backends.base import StepBatch, StepOutput
from backends.cupy_backend.backend import CupyBackend
from backends.cupy_backend.quant_weights import DeviceQuant, stored_types
from backends.manual_batch import SeqState, greedy, make_batch
from backends.model.loader import load_model, open_model
from backends.model.quant import QuantMatrix
from backends.model.weights import StoredTypes
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.weights import STORED_TYPES as NUMPY_STORED_TYPES
from tests.backends.hf_checkpoints import write_bfloat16_checkpoint
from tests.cupy_backend.emu_device import RecordingLauncher, emu_device
from tests.cupy_backend.emu_graph_scenarios import (
    gemma3_graphs_scenario,
    graphs_scenario,
    quant_gemm_graphs_scenario,
    quant_graphs_scenario,
)
from tests.cupy_backend.tiny_model import (
    write_tiny_feature_model,
    write_tiny_gemma3_d256,
    write_tiny_llama_d64_quant,
    write_tiny_llama_k_quant,
)

BLOCK_SIZE, NUM_BLOCKS = 8, 40
# Small enough that decode contexts past it take the partitioned kernel + reduce, shorter ones the plain one.
PARTITION_SIZE = 32
# float32 differs from NumPy only in summation order: logits within 1e-4 (1e-5 of logits of 10 to 17). The
# 16-bit types round weights and every activation through 2 layers, which no rounding analysis bounds usefully:
# their tolerance is a fraction of the largest |logit|, about 2x the largest error measured over the float and
# quant scenarios' logit checks (bfloat16's weight rounding alone moves logits by 1.4 %); a layout or indexing
# bug moves them by the logits' own size. The k-quant scenarios (logits of about 21) measured float32 4.5e-5,
# float16 0.35 % (0.070), bfloat16 2.0 % (0.41); logprobs float16 0.0071, bfloat16 0.15: within these.
FLOAT32_ATOL = 1e-4
LOGIT_RTOL = {
    "float16": 8e-3,  # measured 0.37 % (0.042 of 11-12, chunk 1 of B in both scenarios); bound 2.2x
    "bfloat16": 1e-1,  # measured 4.8 % (0.57 of 12, chunk 1 of B); bound 2.1x
}
LOGPROB_ATOL = {
    "float32": 1e-4,  # summation order, as the logits
    "float16": 0.04,  # measured 0.019 (quant-float16, greedy step 0); bound 2.1x
    "bfloat16": 0.4,  # measured 0.18 (bfloat16, greedy step 1); bound 2.2x
}


@dataclass
class Pair:
    """The backend under test and the reference, stepped in lockstep on identical batches."""

    cupy: CupyBackend
    numpy: NumpyBackend
    launcher: RecordingLauncher
    dtype: str

    def compare_logits(self, batch: StepBatch, what: str) -> np.ndarray:
        got, want = self.cupy.compute_logits(batch), self.numpy.compute_logits(batch)
        assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
        err, tol = float(np.abs(got - want).max()), self.tolerance(want)
        print(f"{what}: max |logit diff| {err:.3g} (tolerance {tol:.3g})", flush=True)
        assert err <= tol, f"{what}: logits differ by {err:.3g} > {tol:.3g}"
        return want

    def tolerance(self, want: np.ndarray) -> float:
        """The largest |logit| difference from the reference's logits `want` the backend may show."""
        return FLOAT32_ATOL if self.dtype == "float32" else LOGIT_RTOL[self.dtype] * float(np.abs(want).max())

    def execute(self, batch: StepBatch) -> tuple[StepOutput, StepOutput]:
        return self.cupy.execute(batch), self.numpy.execute(batch)


def make_pair(library: Path, model_path: Path, dtype: str, stored: tuple[StoredTypes, StoredTypes] = ((), ()),
              partition_size: int = PARTITION_SIZE) -> Pair:
    """`stored`: the types each backend's loader keeps as stored (cupy's, numpy's); none by default."""
    model = load_model(model_path, stored[0])
    device, launcher = emu_device(library)
    cupy = CupyBackend(model.config, model.weights, device, dtype=dtype, partition_size=partition_size)
    numpy = NumpyBackend(load_model(model_path, stored[1]))
    for backend in (cupy, numpy):
        backend.init_cache(NUM_BLOCKS, BLOCK_SIZE)
    return Pair(cupy, numpy, launcher, dtype)


def _seqs(rng: np.random.Generator, count: int, blocks_each: int) -> list[SeqState]:
    """Sequences over disjoint, shuffled physical blocks (block 0 stays unused: it pads the tables)."""
    order = [int(b) for b in rng.permutation(np.arange(1, NUM_BLOCKS))]
    return [SeqState(blocks=order[i * blocks_each : (i + 1) * blocks_each]) for i in range(count)]


def _prompts(rng: np.random.Generator, lengths: tuple[int, ...]) -> list[list[int]]:
    return [[int(t) for t in rng.integers(3, 32, n)] for n in lengths]


def prefill_and_mixed(pair: Pair, rng: np.random.Generator) -> list[SeqState]:
    """A prefill, a first chunk, then one mixed step: a decode row, the chunk's rest and a fresh prompt."""
    a, b, c, spare = _seqs(rng, 4, 9)
    pa, pb, pc = _prompts(rng, (21, 30, 9))
    pair.compare_logits(make_batch([a], [pa[:-1]], BLOCK_SIZE), "prefill A")
    pair.compare_logits(make_batch([b], [pb[:12]], BLOCK_SIZE), "chunk 1 of B")
    pair.compare_logits(make_batch([a, b, c], [pa[-1:], pb[12:], pc], BLOCK_SIZE), "mixed A decode, B rest, C")
    return [a, b, c, spare]


def fork_with_copy(pair: Pair, seqs: list[SeqState]) -> list[SeqState]:
    """D forks A: shares A's full blocks, gets a copy of A's partial last block (copy-on-write), then both
    append different tokens in a decode step."""
    a, b, c, spare = seqs
    full = len(a.tokens) // BLOCK_SIZE
    d = SeqState(blocks=a.blocks[:full] + spare.blocks, tokens=list(a.tokens))
    batch = make_batch([a, b, c, d], [[5], [6], [7], [8]], BLOCK_SIZE)
    batch = replace(batch, block_copies=((a.blocks[full], spare.blocks[0]),))
    pair.compare_logits(batch, "decode after copy-on-write fork")
    return [a, b, c, d]


def greedy_steps(pair: Pair, seqs: list[SeqState], steps: int) -> None:
    """Decode steps sampled on the device (with logprobs); both backends are fed the reference's tokens."""
    last = [[s.tokens[-1]] for s in seqs]
    for i in range(steps):
        batch = make_batch(seqs, last, BLOCK_SIZE)
        assert batch.sampling is not None
        batch = replace(batch, sampling=replace(batch.sampling, want_logprobs=True, num_top_logprobs=3))
        got, want = pair.execute(batch)
        assert got.logprobs is not None and want.logprobs is not None
        assert got.top_token_ids is not None and want.top_token_ids is not None
        lp_err = float(np.abs(got.logprobs - want.logprobs).max())
        print(f"greedy step {i}: tokens {got.token_ids.tolist()} vs {want.token_ids.tolist()}, "
              f"max |logprob diff| {lp_err:.3g}, context {int(batch.context_lens.max())}", flush=True)
        # Where the two pick different tokens (a near tie), their logprobs are still close.
        assert lp_err <= LOGPROB_ATOL[pair.dtype], f"greedy step {i}: logprobs differ by {lp_err:.3g}"
        if pair.dtype == "float32":
            assert got.token_ids.tolist() == want.token_ids.tolist(), f"greedy step {i}: tokens differ"
            assert got.top_token_ids.tolist() == want.top_token_ids.tolist()
        last = [[int(t)] for t in want.token_ids]


def verify_step(pair: Pair, seqs: list[SeqState]) -> None:
    """Speculative decoding's step: A computes its next token and two guesses, each position's logits read
    (sample_lag), beside B's decode."""
    a, b = seqs[0], seqs[1]
    batch = make_batch([a, b], [[9, 10, 11], [12]], BLOCK_SIZE)
    batch = replace(batch, sample_rows=np.array([0, 0, 0, 1], np.int32), sampling=greedy(4),
                    sample_lag=np.array([2, 1, 0, 0], np.int32))
    pair.compare_logits(batch, "verify A's two guesses beside B's decode")


def expected_kernels(dtype: str) -> set[str]:
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    names = ["rms_norm", "fused_add_rms_norm", "rope_and_cache", "silu_mul"]
    attention = ["paged_prefill_attention", "paged_attention_decode", "paged_attention_decode_partitioned",
                 "paged_attention_reduce"]
    return {f"{n}_{short}" for n in names} | {f"{n}_{short}_d64" for n in attention}


def common_steps(pair: Pair, seed: int, kernels: set[str]) -> None:
    """Prefill and a mixed step, a copy-on-write fork, 4 greedy steps and a verification step, every one of
    `kernels` launched along the way. (Contexts are 22..32 after the fork; the steps take them past
    PARTITION_SIZE.)"""
    seqs = fork_with_copy(pair, prefill_and_mixed(pair, np.random.default_rng(seed)))
    greedy_steps(pair, seqs, steps=4)
    verify_step(pair, seqs)
    missing = kernels - set(pair.launcher.names)
    assert not missing, f"kernels never launched: {sorted(missing)}"


def full_scenario(library: Path, model_path: Path, dtype: str) -> None:
    pair = make_pair(library, model_path, dtype)
    common_steps(pair, 3, expected_kernels(dtype))
    print(f"{dtype}: {len(pair.launcher.names)} launches, gemm {pair.cupy.gemm.name}")


def gemma3_kernels(dtype: str, plain_decode: bool) -> set[str]:
    """The tiny Gemma 3's: GeGLU, QK norm, and every attention kernel at head_dim 256 (the plain decode kernel
    only where some decode span fits one partition)."""
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    attention = ["paged_prefill_attention", "paged_attention_decode_partitioned", "paged_attention_reduce",
                 *(["paged_attention_decode"] if plain_decode else [])]
    names = ["rms_norm", "fused_add_rms_norm", "rope_and_cache", "gelu_tanh_mul", "head_rms_norm"]
    return {f"{n}_{short}" for n in names} | {f"{n}_{short}_d256" for n in attention}


def check_window_matters(pair: Pair, rng: np.random.Generator) -> None:
    """The reference with a window as long as the context (the same layers, RoPE bases and all, attending to every
    position) gives a 30-token prompt's logits farther from the windowed reference's than the scenario's
    tolerance by far: a backend that ignored the window would fail the comparisons. (bfloat16's tolerance, a
    tenth of the largest logit, is too coarse to tell: there the float32 and float16 scenarios stand for it.)"""
    model = pair.numpy.model
    config = model.config
    wide = replace(model, files=replace(model.files, config=replace(config, sliding_window=config.context_length)))
    prompts, logits = _prompts(rng, (30,)), []
    for reference in (NumpyBackend(model), NumpyBackend(wide)):
        reference.init_cache(NUM_BLOCKS, BLOCK_SIZE)
        logits.append(reference.compute_logits(make_batch([SeqState(blocks=[1, 2, 3, 4])], prompts, BLOCK_SIZE)))
    windowed, unwindowed = logits
    moved, tol = float(np.abs(windowed - unwindowed).max()), pair.tolerance(windowed)
    print(f"window: the unwindowed reference's logits move by {moved:.3g} (tolerance {tol:.3g})", flush=True)
    assert moved > 10 * tol or pair.dtype == "bfloat16", f"the window moves the logits by only {moved:.3g}"


def gemma3_scenario(library: Path, model_path: Path, dtype: str, partition_size: int = PARTITION_SIZE) -> None:
    path = write_tiny_gemma3_d256(model_path.with_name(f"tiny-gemma3-{dtype}-{partition_size}.gguf"))
    pair = make_pair(library, path, dtype, partition_size=partition_size)
    check_window_matters(pair, np.random.default_rng(8))
    rng = np.random.default_rng(7)
    seqs = fork_with_copy(pair, prefill_and_mixed(pair, rng))
    greedy_steps(pair, seqs, steps=4)  # contexts to 36, past the window of 16 and, for some, one partition
    pair.compare_logits(make_batch(seqs, [[9], [10], [11], [12]], BLOCK_SIZE), "decode past window and partition")
    verify_step(pair, seqs)
    missing = gemma3_kernels(dtype, plain_decode=partition_size >= 16) - set(pair.launcher.names)
    assert not missing, f"kernels never launched: {sorted(missing)}"
    print(f"gemma3 {dtype} (partitions of {partition_size}): {len(pair.launcher.names)} launches")


def feature_scenario(library: Path, model_path: Path, arch: str, dtype: str) -> None:
    """The full scenario's steps on the tiny model as `arch` (tiny_model.write_tiny_feature_model)."""
    path = write_tiny_feature_model(model_path.with_name(f"tiny-{arch}-{dtype}.gguf"), arch)
    pair = make_pair(library, path, dtype)
    assert pair.cupy.config.features, "the tiny model has none of the features it is meant to test"
    common_steps(pair, 9, expected_kernels(dtype))
    print(f"{arch} {dtype} ({', '.join(pair.cupy.config.features)}): {len(pair.launcher.names)} launches")


def quant_kernels(dtype: str) -> set[str]:
    """The tiny quantized model's kernels: decode rows and sampled logits through the GEMV (the head is the
    Q8_0 embedding), prefill chunks through the GEMM on the Q4_1 / Q4_0 blocks, embedding rows of Q8_0."""
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    names = ["quant_gemv_q4_1", "quant_gemv_q4_0", "quant_gemv_logits_q8_0", "quant_gemm_q4_1", "quant_gemm_q4_0",
             "dequantize_q8_0"]
    return {f"{n}_{short}" for n in names}


def check_no_dense_copy(pair: Pair, embedding_type: str) -> None:
    """The only rows ever dequantized into memory are the embedding's: no matrix was widened for a product."""
    copied = {name.rsplit("_", 1)[0] for name in pair.launcher.names if name.startswith("dequantize_")}
    assert copied <= {f"dequantize_{embedding_type}"}, f"dense copies made: {sorted(copied)}"


def check_uploaded_as_stored(pair: Pair) -> None:
    """Quantized matrices reach the device as their stored bytes; the F16 one as a dense matrix."""
    host, device = pair.numpy.model.weights, pair.cupy.weights
    assert isinstance(device.embedding, DeviceQuant) and device.lm_head is device.embedding
    for name in ("wqkv", "w_gate_up", "w_down"):
        stored = getattr(host.layers[0], name)
        assert np.array_equal(getattr(device.layers[0], name).data, stored.data), name
    assert not isinstance(device.layers[1].wo, DeviceQuant) and device.layers[1].wo.dtype == pair.cupy.storage.dtype


def quant_scenario(library: Path, model_path: Path, dtype: str) -> None:
    path = write_tiny_llama_d64_quant(model_path.with_name(f"tiny-d64-quant-{dtype}.gguf"))
    pair = make_pair(library, path, dtype, (stored_types(), NUMPY_STORED_TYPES))
    check_uploaded_as_stored(pair)
    rng = np.random.default_rng(4)
    greedy_steps(pair, fork_with_copy(pair, prefill_and_mixed(pair, rng)), steps=4)
    missing = (expected_kernels(dtype) | quant_kernels(dtype)) - set(pair.launcher.names)
    assert not missing, f"kernels never launched: {sorted(missing)}"
    check_no_dense_copy(pair, "q8_0")
    print(f"quant {dtype}: {len(pair.launcher.names)} launches, {pair.cupy.weights.num_bytes} bytes of weights")


def k_quant_kernels(dtype: str) -> set[str]:
    """The K-quant model's: every new type through the GEMV (decode rows) and the GEMM (prefill chunks), the
    Q6_K head's logits through the GEMV, its embedding rows dequantized."""
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    types = ("q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
    names = [f"{base}_{t}" for base in ("quant_gemv", "quant_gemm") for t in types]
    names += ["quant_gemv_logits_q6_k", "dequantize_q6_k"]
    return {f"{n}_{short}" for n in names}


def check_all_uploaded_as_stored(pair: Pair) -> None:
    """Every matrix of the K-quant model reaches the device as its stored bytes, in its own type."""
    host, device = pair.numpy.model.weights, pair.cupy.weights
    assert isinstance(device.embedding, DeviceQuant) and device.lm_head is device.embedding
    for host_layer, device_layer in zip(host.layers, device.layers, strict=True):
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            stored, uploaded = getattr(host_layer, name), getattr(device_layer, name)
            assert isinstance(uploaded, DeviceQuant) and uploaded.qtype == stored.qtype.name.lower(), name
            assert np.array_equal(uploaded.data, stored.data), name


def k_quant_scenario(library: Path, model_path: Path, dtype: str) -> None:
    path = write_tiny_llama_k_quant(model_path.with_name(f"tiny-k-quant-{dtype}.gguf"))
    pair = make_pair(library, path, dtype, (stored_types(), NUMPY_STORED_TYPES))
    check_all_uploaded_as_stored(pair)
    rng = np.random.default_rng(5)
    greedy_steps(pair, fork_with_copy(pair, prefill_and_mixed(pair, rng)), steps=4)
    missing = (expected_kernels(dtype) | k_quant_kernels(dtype)) - set(pair.launcher.names)
    assert not missing, f"kernels never launched: {sorted(missing)}"
    check_no_dense_copy(pair, "q6_k")
    print(f"k-quant {dtype}: {len(pair.launcher.names)} launches, {pair.cupy.weights.num_bytes} bytes of weights")


def checkpoint_scenario(library: Path, model_path: Path) -> None:
    """The tiny model as a Hugging Face checkpoint of bfloat16 matrices: CupyBackend (bfloat16) holds each as the
    checkpoint stores it and matches NumpyBackend reading the same bfloat16 matrices as stored."""
    _, files = open_model(model_path)
    directory = write_bfloat16_checkpoint(load_model(model_path), files, model_path.with_name("tiny-d64-checkpoint"))
    pair = make_pair(library, directory, "bfloat16", (stored_types(), NUMPY_STORED_TYPES))
    host, device = pair.numpy.model.weights.layers[0].wqkv, pair.cupy.weights.layers[0].wqkv
    assert isinstance(host, QuantMatrix) and host.qtype.name == "BF16"
    assert np.array_equal(np.asarray(device).view(np.uint16), host.data.view(np.uint16)), "bfloat16 bits changed"
    rng = np.random.default_rng(6)
    greedy_steps(pair, fork_with_copy(pair, prefill_and_mixed(pair, rng)), steps=4)
    missing = expected_kernels("bfloat16") - set(pair.launcher.names)
    assert not missing, f"kernels never launched: {sorted(missing)}"
    print(f"checkpoint bfloat16: {len(pair.launcher.names)} launches")


def gpu_check_dry_run(library: Path, model_path: Path) -> None:
    """bench/gpu_check.py's measurement sections, shrunk, on the emulated device: the same code paths as on the
    GPU except CuPy's timer (wall clock here) and the numbers' meaning."""
    from bench import gpu_check  # noqa: PLC0415 - only this scenario needs it
    from bench.decode_policy import policy_from_run  # noqa: PLC0415

    device, launcher = emu_device(library)
    plan = gpu_check.Plan(dtype="bfloat16", bandwidth_batch=2, bandwidth_context=40, bandwidth_repeats=1,
                          decode_batches=(1, 2), decode_context=20, decode_steps=1, warmup_steps=1, num_layers=1,
                          vocab_size=512, quant_batches=(2, 9), gemv_shapes=(("q4_1", 24, 256), ("q8_0", 40, 64)),
                          gemv_rows=(1, 8), gemv_repeats=1, graph_batches=(1, 2),
                          gemm_shapes=(("q4_1", 70, 64),), gemm_rows=(8, 65), sweep_shapes=((4, 2, 64), (2, 1, 256)),
                          sweep_batches=(1, 3), sweep_contexts=(20, 600), sweep_repeats=1)
    ctx = gpu_check.Context(plan=plan, device=device, env={"peak_bandwidth_gbs": 100.0})
    measured = ("decode_bandwidth", "decode_sweep", "e2e_decode", "quant_gemv", "quant_gemm", "e2e_decode_quant",
                "cuda_graphs")
    report = gpu_check.run(ctx, [s for s in gpu_check.SECTIONS if s[0] in measured], budget_s=600.0)
    assert report.ok, report.sections
    bandwidth, e2e = report.sections["decode_bandwidth"], report.sections["e2e_decode"]
    assert bandwidth["plain"]["microseconds"] > 0 and bandwidth["partitioned"]["fraction_of_peak"] is not None
    assert set(e2e["batches"]) == {"1", "2"} and all(
        v["step_ms"] > 0 and v["tokens_per_s"] > 0 for v in e2e["batches"].values()), e2e
    gemv = report.sections["quant_gemv"]["matrices"]["q4_1 24x256"]
    assert gemv["stored_bytes"] == 24 * 256 // 32 * 20 and gemv["rows_8"]["fraction_of_peak"] is not None
    sweep = report.sections["decode_sweep"]
    assert len(sweep["points"]) == 8 and all(p["plain"]["microseconds"] > 0 for p in sweep["points"]), sweep
    policy = policy_from_run({"sections": report.sections}, "dry run")
    assert {(p.blocks, p.span, p.head_dim) for p in policy.points} == {
        (b * h, c, d) for h, d in ((4, 64), (2, 256)) for b in (1, 3) for c in (20, 600)}
    gemm = report.sections["quant_gemm"]["matrices"]["q4_1 70x64"]
    assert set(gemm) == {"8", "65"} and "gemv_us" in gemm["8"] and "gemv_us" not in gemm["65"], gemm
    assert all(r["quant_us"] > 0 and r["dense_us"] > 0 and r["copy_then_gemm_us"] > 0 for r in gemm.values())
    quant = report.sections["e2e_decode_quant"]
    assert set(quant["batches"]) == {"2", "9"} and quant["weight_bytes"] < e2e["weight_bytes"]
    graphs = report.sections["cuda_graphs"]
    assert set(graphs["batches"]) == {"1", "2"} and graphs["buckets"] == [1, 2], graphs
    assert all(v["eager_ms"] > 0 and v["replay_ms"] > 0 for v in graphs["batches"].values())
    assert {"paged_attention_decode_bf16_d64_b16", "paged_attention_decode_partitioned_bf16_d64_b16",
            "paged_attention_reduce_bf16_d64", "quant_gemv_q4_1_bf16", "quant_gemv_logits_q8_0_bf16",
            "quant_gemm_q4_1_bf16", "dequantize_q4_1_bf16", "dequantize_q8_0_bf16"} <= set(launcher.names)


Scenario = Callable[[Path, Path], None]
DTYPES = ("float32", "float16", "bfloat16")


def scenarios() -> dict[str, Scenario]:
    def bind(dtype: str) -> Scenario:
        return lambda library, model_path: full_scenario(library, model_path, dtype)

    def bind_quant(dtype: str) -> Scenario:
        return lambda library, model_path: quant_scenario(library, model_path, dtype)

    def bind_k_quant(dtype: str) -> Scenario:
        return lambda library, model_path: k_quant_scenario(library, model_path, dtype)

    def bind_gemma3(dtype: str, partition_size: int) -> Scenario:
        return lambda library, model_path: gemma3_scenario(library, model_path, dtype, partition_size)

    gemma3 = {f"gemma3-{dtype}": bind_gemma3(dtype, PARTITION_SIZE) for dtype in DTYPES}
    gemma3["gemma3-parts8-float32"] = bind_gemma3("float32", 8)

    def bind_feature(arch: str, dtype: str) -> Scenario:
        return lambda library, model_path: feature_scenario(library, model_path, arch, dtype)

    features = {f"{name}-{dtype}": bind_feature(arch, dtype) for name, arch in
                (("qwen2", "qwen2"), ("qwen3", "qwen3"), ("llama3", "llama")) for dtype in ("float32", "bfloat16")}
    quant = {f"quant-{dtype}": bind_quant(dtype) for dtype in DTYPES}
    k_quant = {f"k-quant-{dtype}": bind_k_quant(dtype) for dtype in DTYPES}
    graphs = {"graphs-float32": graphs_scenario, "graphs-quant-bfloat16": quant_graphs_scenario,
              "graphs-quant-gemm-bfloat16": quant_gemm_graphs_scenario,
              "graphs-gemma3-float32": gemma3_graphs_scenario}
    from tests.cupy_backend import emu_window_scenarios as pool  # noqa: PLC0415 - it builds on this module

    pooled = {"gemma3-window-pool-parts8-float32": lambda lib, path: pool.window_pool_scenario(lib, path, "float32", 8),
              "gemma3-window-pool-bfloat16": lambda lib, path: pool.window_pool_scenario(lib, path, "bfloat16", 32),
              "graphs-gemma3-window-pool-float32": pool.graphs_window_pool_scenario}
    return {**{dtype: bind(dtype) for dtype in DTYPES}, **quant, **k_quant, "checkpoint-bfloat16": checkpoint_scenario,
            "gpu-check-dry-run": gpu_check_dry_run, **graphs, **gemma3, **features, **pooled}
