"""The CuPy backend on a real GPU against the NumPy backend (skipped unless CuPy imports and sees a device).

Two kinds of model: the real default model (SmolLM2-135M, when its package is installed), checked against the
golden reference; and random weights in SmolLM2's shape (no model file needed), checked step by step against
NumpyBackend on the same weights. Each also with its matrices kept as stored (Q4_1, Q8_0), read by the
dequantizing kernels; and a tiny model whose matrices are Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K. Measured
errors are printed (see them with -rP) for calibration.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.base import SamplingInputs, StepBatch
from backends.cupy_backend.backend import CupyBackend
from backends.cupy_backend.device import Device
from backends.cupy_backend.graphs import GraphSettings
from backends.cupy_backend.quant_weights import stored_types
from backends.cupy_backend.synthetic import smollm2_shape, stored_like_default, synthetic_model
from backends.manual_batch import SeqState, make_batch
from backends.model.config import ModelLoadError
from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.backend import NumpyBackend
from tests.cupy_backend.tiny_model import write_tiny_gemma3_d256, write_tiny_llama_k_quant
from tests.required import hardware_absent, unavailable

pytestmark = pytest.mark.gpu

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "smollm2_golden.json").read_text())
BLOCK, NUM_BLOCKS = 16, 512
MARGIN_FLOOR = 2e-3  # a greedy step closer than this to a tie may legitimately flip
FLOAT32_LOGIT_ATOL = 2e-3  # cuBLAS and NumPy sum in different orders
# 16-bit logits against float32, as a fraction of the row's largest |logit|: bounds, not measurements. The one
# GPU run on record (docs/PERFORMANCE.md, synthetic model only) measured float16 0.16 and bfloat16 1.1 of logits
# up to 368 (0.04 % and 0.3 %); the real model's error is not on record, so these stay until a GPU run measures it.
LOW_PRECISION_RTOL = {"float16": 0.02, "bfloat16": 0.05}


@pytest.fixture(scope="module")
def gpu() -> Device:
    try:
        import cupy  # noqa: PLC0415

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - ImportError, no driver, a broken CUDA install
        hardware_absent(f"no usable CuPy / CUDA device ({type(exc).__name__}: {exc})")
    if count == 0:
        hardware_absent("CuPy sees no CUDA device")
    from backends.cupy_backend.device import cupy_device  # noqa: PLC0415

    return cupy_device()


@pytest.fixture(scope="module")
def real_model() -> LoadedModel:
    try:
        return load_model()
    except ModelLoadError as exc:
        unavailable(f"the default model is not installed ({exc})", "the real-model GPU checks")


@pytest.fixture(scope="module")
def real_model_stored() -> LoadedModel:
    try:
        return load_model(stored=stored_types())
    except ModelLoadError as exc:
        unavailable(f"the default model is not installed ({exc})", "the real-model GPU checks")


@pytest.fixture(scope="module")
def synthetic() -> LoadedModel:
    return synthetic_model(smollm2_shape(num_layers=4), seed=1)


@pytest.fixture(scope="module")
def synthetic_stored(synthetic: LoadedModel) -> LoadedModel:
    """The same random weights stored like the default model's file (Q4_1 matrices, Q8_0 embedding and head)."""
    return replace(synthetic, weights=stored_like_default(synthetic.weights))


@pytest.fixture(scope="module")
def k_quant_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(write_tiny_llama_k_quant(tmp_path_factory.mktemp("k_quant") / "k.gguf"), stored=stored_types())


def cupy_backend(gpu: Device, model: LoadedModel, dtype: str) -> CupyBackend:
    backend = CupyBackend(model.config, model.weights, gpu, dtype=dtype)
    backend.init_cache(NUM_BLOCKS, BLOCK)
    return backend


def numpy_backend(model: LoadedModel) -> NumpyBackend:
    backend = NumpyBackend(model)
    backend.init_cache(NUM_BLOCKS, BLOCK)
    return backend


def new_seqs(lengths: list[int], seed: int) -> list[SeqState]:
    """Sequences on disjoint shuffled blocks, each with room for its length plus 32 tokens."""
    order = [int(b) for b in np.random.default_rng(seed).permutation(np.arange(1, NUM_BLOCKS))]
    seqs, used = [], 0
    for n in lengths:
        need = -(-(n + 32) // BLOCK)
        seqs.append(SeqState(blocks=order[used : used + need]))
        used += need
    return seqs


def random_prompts(lengths: list[int], seed: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, n)] for n in lengths]


def assert_logits_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    err = np.abs(got - want).max(axis=-1)
    scale = np.abs(want).max(axis=-1)
    tol = np.full_like(scale, FLOAT32_LOGIT_ATOL) if dtype == "float32" else LOW_PRECISION_RTOL[dtype] * scale
    print(f"{what} [{dtype}]: max |logit diff| per row {np.round(err, 5).tolist()} (max |logit| "
          f"{np.round(scale, 2).tolist()})")
    assert (err <= tol).all(), f"{what}: logits differ by {err.tolist()} > {tol.tolist()}"


def lockstep_greedy(a: CupyBackend, b: NumpyBackend, seqs_a: list[SeqState], seqs_b: list[SeqState],
                    prompts: list[list[int]], steps: int, dtype: str) -> None:
    """Prefill every prompt in one mixed step, then decode greedily; both backends are fed b's tokens and
    their tokens must agree wherever b's top-2 margin is clear."""
    chunks = prompts
    for step in range(steps):
        batch_a, batch_b = make_batch(seqs_a, chunks, BLOCK), make_batch(seqs_b, chunks, BLOCK)
        got, want = a.compute_logits(batch_a), b.compute_logits(batch_b)
        assert_logits_close(got, want, dtype, f"step {step}")
        top2 = np.sort(want, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > MARGIN_FLOOR
        if dtype == "float32":
            assert (got.argmax(-1) == want.argmax(-1))[clear].all(), f"step {step}: greedy tokens differ"
        chunks = [[int(t)] for t in want.argmax(-1)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_synthetic_model_matches_numpy_step_by_step(gpu: Device, synthetic: LoadedModel, dtype: str) -> None:
    lengths = [40, 17, 5, 64]
    prompts = random_prompts(lengths, seed=2, vocab=synthetic.config.vocab_size)
    lockstep_greedy(cupy_backend(gpu, synthetic, dtype), numpy_backend(synthetic), new_seqs(lengths, 3),
                    new_seqs(lengths, 3), prompts, steps=8, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_weights_match_numpy_step_by_step(gpu: Device, synthetic_stored: LoadedModel, dtype: str) -> None:
    """Prefill (through the dequantizing GEMM) and batch-4 decode (through the dequantizing GEMV) against
    NumpyBackend reading the same blocks."""
    lengths = [40, 17, 5, 64]
    prompts = random_prompts(lengths, seed=2, vocab=synthetic_stored.config.vocab_size)
    lockstep_greedy(cupy_backend(gpu, synthetic_stored, dtype), numpy_backend(synthetic_stored), new_seqs(lengths, 3),
                    new_seqs(lengths, 3), prompts, steps=8, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_k_quant_weights_match_numpy_step_by_step(gpu: Device, k_quant_model: LoadedModel, dtype: str) -> None:
    """The same on every other type the kernels read (tiny_model.K_QUANT_TYPES), both backends reading the
    blocks as stored."""
    lengths = [40, 17, 5, 64]
    prompts = random_prompts(lengths, seed=3, vocab=k_quant_model.config.vocab_size)
    lockstep_greedy(cupy_backend(gpu, k_quant_model, dtype), numpy_backend(k_quant_model), new_seqs(lengths, 4),
                    new_seqs(lengths, 4), prompts, steps=8, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_gemma3_matches_numpy_step_by_step(gpu: Device, dtype: str, tmp_path: Path) -> None:
    """Gemma 3's layer (head_dim 256, so the prefill kernel's shared memory past 48 KiB; sliding layers over a
    window of 16 that these prompts outgrow) against NumpyBackend, prefill then decode."""
    model = load_model(write_tiny_gemma3_d256(tmp_path / "gemma3.gguf"))
    lengths = [40, 17, 5, 64]
    prompts = random_prompts(lengths, seed=5, vocab=model.config.vocab_size)
    lockstep_greedy(cupy_backend(gpu, model, dtype), numpy_backend(model), new_seqs(lengths, 6), new_seqs(lengths, 6),
                    prompts, steps=8, dtype=dtype)


def test_long_contexts_take_the_partitioned_decode(gpu: Device, synthetic: LoadedModel) -> None:
    """Contexts over 512 tokens, prefilled in chunks of 256 after a cached prefix, then decoded through the
    partitioned kernel (forced: whichever the decode policy picks, this test checks the split one)."""
    lengths = [1100, 600, 40]
    prompts = random_prompts(lengths, seed=4, vocab=synthetic.config.vocab_size)
    gpu_backend, ref_backend = cupy_backend(gpu, synthetic, "float32"), numpy_backend(synthetic)
    gpu_backend.forward.k = replace(gpu_backend.forward.k, split_decode=True)
    gpu_seqs, ref_seqs = new_seqs(lengths, 5), new_seqs(lengths, 5)
    for start in range(0, max(lengths), 256):
        live = [i for i, n in enumerate(lengths) if start < n]
        chunks = [prompts[i][start : start + 256] for i in live]
        got = gpu_backend.compute_logits(make_batch([gpu_seqs[i] for i in live], chunks, BLOCK))
        want = ref_backend.compute_logits(make_batch([ref_seqs[i] for i in live], chunks, BLOCK))
        assert_logits_close(got, want, "float32", f"chunk at {start}")
    decode = [[7]] * len(lengths)
    outs = [gpu_backend.compute_logits(make_batch(gpu_seqs, decode, BLOCK)),
            ref_backend.compute_logits(make_batch(ref_seqs, decode, BLOCK))]
    assert_logits_close(outs[0], outs[1], "float32", "decode over long contexts")


def sampling_inputs(n: int, vocab: int, seed: int) -> SamplingInputs:
    """Every sampling feature at once: temperature, top-k, top-p, min-p, the three penalties, suppressed ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (n, 6)).astype(np.int64)
    ids[:, -1] = -1  # padding
    return SamplingInputs(
        temperature=np.array([0.0, 0.7, 1.0, 1.3][:n], np.float32),
        top_k=np.array([0, 40, 0, 5][:n], np.int32),
        top_p=np.array([1.0, 0.9, 0.95, 1.0][:n], np.float32),
        min_p=np.array([0.0, 0.0, 0.05, 0.0][:n], np.float32),
        uniforms=rng.random(n).astype(np.float32),
        presence_penalty=np.full(n, 0.3, np.float32),
        frequency_penalty=np.full(n, 0.2, np.float32),
        repetition_penalty=np.full(n, 1.1, np.float32),
        output_token_ids=ids,
        prompt_token_ids=ids[:, ::-1].copy(),
        suppressed_token_ids=ids[:, :2].copy(),
        num_top_logprobs=3,
        want_logprobs=True,
    )


def test_device_sampling_matches_numpy(gpu: Device, synthetic: LoadedModel) -> None:
    """sampling.sample with xp = cupy (penalties use cupyx.scatter_add) picks the tokens NumPy picks."""
    lengths = [12, 30, 7, 21]
    prompts = random_prompts(lengths, seed=6, vocab=synthetic.config.vocab_size)
    params = sampling_inputs(len(lengths), synthetic.config.vocab_size, seed=7)
    outs = []
    for backend, seqs in ((cupy_backend(gpu, synthetic, "float32"), new_seqs(lengths, 8)),
                          (numpy_backend(synthetic), new_seqs(lengths, 8))):
        batch: StepBatch = replace(make_batch(seqs, prompts, BLOCK), sampling=params)
        outs.append(backend.execute(batch))
    got, want = outs
    assert got.token_ids.tolist() == want.token_ids.tolist()
    assert got.logprobs is not None and want.logprobs is not None
    # logit - logsumexp: within twice the logits' float32 summation-order error, for which FLOAT32_LOGIT_ATOL allows
    # 2e-3; 1e-3 is tighter than that bound and not measured (no GPU run of this test on record), so left as it was
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-3)
    assert got.top_token_ids is not None and want.top_token_ids is not None
    assert got.top_token_ids.tolist() == want.top_token_ids.tolist()


def graph_sampling(n: int, seed: int, top_p: float) -> SamplingInputs:
    """Greedy and random rows, some with min_p: what the graph samples, unless top_p < 1 sends it eagerly."""
    return SamplingInputs(temperature=np.resize(np.array([0.0, 0.7, 1.0, 1.3], np.float32), n),
                          top_k=np.zeros(n, np.int32), top_p=np.full(n, top_p, np.float32),
                          min_p=np.resize(np.array([0.0, 0.0, 0.05, 0.0], np.float32), n),
                          uniforms=np.random.default_rng(seed).random(n).astype(np.float32), want_logprobs=True)


def test_decode_graphs_replay_the_eager_steps(gpu: Device, synthetic: LoadedModel) -> None:
    """Real CUDA stream capture (lazy, buckets up to 8): decode steps of 3 and 8 sequences, sampled inside the
    graph (greedy, random, min_p) or by the eager sampler on the graph's logits (top-p), give the tokens and
    logprobs of the same steps run eagerly; the prefill stays eager; the KV pools agree."""
    lengths = [40, 17, 5, 64, 33, 9, 70, 21]
    prompts = random_prompts(lengths, seed=9, vocab=synthetic.config.vocab_size)
    graphed = CupyBackend(synthetic.config, synthetic.weights, gpu, graphs=GraphSettings("lazy", 8))
    graphed.init_cache(NUM_BLOCKS, BLOCK)
    eager = cupy_backend(gpu, synthetic, "float32")
    twins = ((graphed, new_seqs(lengths, 10)), (eager, new_seqs(lengths, 10)))
    for step in range(6):
        rows = 3 if step % 2 else len(lengths)
        chunks = prompts if step == 0 else [[7 + step]] * rows
        params = graph_sampling(rows, seed=step, top_p=0.9 if step == 5 else 1.0)
        got, want = (b.execute(replace(make_batch(seqs[:rows], chunks, BLOCK), sampling=params)) for b, seqs in twins)
        assert got.token_ids.tolist() == want.token_ids.tolist(), f"step {step}"
        assert got.logprobs is not None and want.logprobs is not None
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=FLOAT32_LOGIT_ATOL)
    assert graphed.graphs is not None and sorted(graphed.graphs.graphs) == [4, 8]
    pools = gpu.to_host(graphed.cache.data), gpu.to_host(eager.cache.data)
    np.testing.assert_allclose(pools[0], pools[1], atol=FLOAT32_LOGIT_ATOL)


def golden_decided(case: dict[str, object]) -> list[int]:
    """The golden greedy ids up to the first near-tie."""
    expected = list(case["greedy_ids"])  # type: ignore[call-overload]
    margins = list(case["greedy_top2_margins"])  # type: ignore[call-overload]
    decided = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(expected))
    return expected[:decided]


def test_real_model_greedy_tokens_match_golden_float32(gpu: Device, real_model: LoadedModel) -> None:
    """All golden prompts batched: one mixed prefill step, then batched decode steps on device sampling."""
    greedy_matches_golden(cupy_backend(gpu, real_model, "float32"))


def test_real_model_stored_weights_greedy_tokens_match_golden_float32(gpu: Device,
                                                                       real_model_stored: LoadedModel) -> None:
    """The same with the file's Q4_1 / Q8_0 matrices read as stored: gguf's values, so the same tokens."""
    greedy_matches_golden(cupy_backend(gpu, real_model_stored, "float32"))


def greedy_matches_golden(backend: CupyBackend) -> None:
    cases = GOLDEN["prompts"]
    prompts = [c["token_ids"] for c in cases]
    seqs = new_seqs([len(p) for p in prompts], seed=9)
    steps = max(len(c["greedy_ids"]) for c in cases)
    generated: list[list[int]] = [[] for _ in cases]
    chunks = prompts
    for _ in range(steps):
        out = backend.execute(make_batch(seqs, chunks, BLOCK))
        for row, token in enumerate(out.token_ids.tolist()):
            generated[row].append(int(token))
        chunks = [[g[-1]] for g in generated]
    for case, tokens in zip(cases, generated, strict=True):
        want = golden_decided(case)
        assert len(want) >= min(len(case["greedy_ids"]), 8), "the comparison would be vacuous"
        assert tokens[: len(want)] == want, f"{case['name']}: {tokens[: len(want)]} != {want}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_real_model_prefill_logits_match_golden(gpu: Device, real_model: LoadedModel, dtype: str) -> None:
    backend = cupy_backend(gpu, real_model, dtype)
    for index, case in enumerate(GOLDEN["prompts"]):
        ids = case["token_ids"]
        logits = backend.compute_logits(make_batch(new_seqs([len(ids)], seed=index), [ids], BLOCK))[0]
        top = np.array(case["last_logits_top"])
        assert_logits_close(logits[top[:, 0].astype(int)][None], top[None, :, 1], dtype, case["name"])
        if case["greedy_top2_margins"][0] > (MARGIN_FLOOR if dtype == "float32" else 0.5):
            assert int(np.argmax(logits)) == int(top[0, 0]), f"{case['name']}: argmax differs"
