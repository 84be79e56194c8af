"""The fast precision (fast_matmul.h): on a CPU whose AMX tiles the process may use, steps of FAST_MIN_ROWS rows
or more multiply bfloat16-rounded values on the tiles, checked against NumPy's product of the same rounded values;
smaller steps, and every step without AMX, are the exact kernels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel, load_model
from backends.model.quant import QuantMatrix
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.matmul import NativeMatmul, fast_reference, to_bfloat16
from backends.numpy_backend.native.weights import STORED_TYPES

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
FAST_MIN_ROWS = 4  # fast_matmul.h
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16)


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> NativeMatmul:
    return NativeMatmul(cache_dir=tmp_path_factory.mktemp("kernels"), fast=True)


@pytest.fixture(scope="module")
def exact(fast: NativeMatmul) -> NativeMatmul:
    return NativeMatmul(cache_dir=fast.library_path.parent)


@pytest.fixture(scope="module")
def tiles(fast: NativeMatmul) -> None:
    """A skip where the process may not use AMX tiles: the machine lacks them, so CI may too."""
    if not fast.fast_uses_tiles:
        pytest.skip("no AMX tiles on this machine")


needs_tiles = pytest.mark.usefixtures("tiles")


def stored(qtype: Q, rows: int, cols: int, seed: int = 0) -> QuantMatrix:
    return QuantMatrix.quantize(np.random.default_rng(seed).normal(0, 0.3, (rows, cols)).astype(np.float32), qtype)


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def test_bfloat16_rounding_is_to_nearest_even() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, -3.0, 0.0, 65504.0, 1.0000001], np.float32)
    expected = np.array([1.0, 1.0, 1.015625, -3.0, 0.0, 65536.0, 1.0], np.float32)  # ties go to the even one
    np.testing.assert_array_equal(to_bfloat16(values), expected)


SHAPES = [(t, inner, outputs) for t in TYPES for inner, outputs in ((64, 13), (576, 960), (1536, 577))] + [
    (t, 40, 19) for t in (Q.F16, Q.BF16)]  # widths past whole tiles of 32, where the format allows them


@needs_tiles
@pytest.mark.parametrize(("qtype", "inner", "outputs"), SHAPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [FAST_MIN_ROWS, 5, 16, 17, 33, 64, 130])
def test_tiles_multiply_the_rounded_values(fast: NativeMatmul, qtype: Q, inner: int, outputs: int, rows: int) -> None:
    """Every type; rows and weight rows past whole tiles of 16 (zero padding)."""
    w, x = stored(qtype, outputs, inner, seed=inner + outputs), activations(rows, inner, seed=rows)
    reference = fast_reference(x, w).astype(np.float64)
    scale = np.abs(to_bfloat16(x)).astype(np.float64) @ np.abs(to_bfloat16(w.dequantize())).T.astype(np.float64)
    out = fast.project(x, w)
    assert out.shape == (rows, outputs) and out.dtype == np.float32
    assert np.all(np.abs(out - reference) <= 1e-6 * scale + 1e-7)  # float32 sums of exact products


@needs_tiles
def test_a_rows_result_does_not_depend_on_its_tile_or_lane(fast: NativeMatmul) -> None:
    w, x = stored(Q.Q4_1, 45, 576), activations(40, 576)
    together = fast.project(x, w)
    np.testing.assert_array_equal(fast.project(x[20:24], w), together[20:24])
    np.testing.assert_array_equal(fast.project(np.concatenate([x[7:9], x[33:35]]), w),
                                  together[[7, 8, 33, 34]])


@pytest.mark.parametrize("rows", [1, 2, FAST_MIN_ROWS - 1])
def test_small_steps_are_exact(fast: NativeMatmul, exact: NativeMatmul, rows: int) -> None:
    w, x = stored(Q.Q4_1, 77, 576), activations(rows, 576)
    np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


def test_without_tiles_fast_is_exact(fast: NativeMatmul, exact: NativeMatmul) -> None:
    if fast.fast_uses_tiles:
        assert fast.fast
        pytest.skip("this machine has the tiles")
    assert not fast.fast
    w, x = stored(Q.Q8_0, 30, 64), activations(16, 64)
    np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(stored=STORED_TYPES)


@needs_tiles
def test_the_fused_step_in_the_fast_precision(model: LoadedModel) -> None:
    """A step of 8 prompts of 5 tokens (40 rows: the tiles) through the default model: the logits stay within
    bfloat16's reach of the exact ones, and each row's greedy token is the exact one's or a near tie with it."""
    backends = [NumpyBackend(model, "native", precision) for precision in ("exact", "fast")]
    logits = []
    for backend in backends:
        backend.init_cache(64, 16)
        seqs = [SeqState(blocks=[2 * i, 2 * i + 1]) for i in range(8)]
        chunks = [[200 + 37 * i + j for j in range(5)] for i in range(8)]
        logits.append(backend.compute_logits(make_batch(seqs, chunks, 16)))
    exact_logits, fast_logits = logits
    assert not np.array_equal(exact_logits, fast_logits)  # the tiles ran
    tolerance = 0.05 * np.abs(exact_logits).max()
    assert np.abs(fast_logits - exact_logits).max() < tolerance
    chosen = exact_logits[np.arange(8), fast_logits.argmax(1)]
    assert np.all(chosen >= exact_logits.max(1) - tolerance)
    assert np.mean(fast_logits.argmax(1) == exact_logits.argmax(1)) >= 0.75


@needs_tiles
def test_greedy_decoding_in_the_fast_precision_follows_the_exact_one(model: LoadedModel) -> None:
    """8 chat prompts decoded together (steps of 8 rows: the tiles) for 12 tokens: most continuations agree
    token for token with the exact precision's (a projection that read stale values past its own width once
    made every one of them differ from the second token on)."""
    from bench.precision import agreement, greedy, prompts  # noqa: PLC0415 - the benchmark's own helpers

    ids = prompts(model, 8)
    outs = [greedy(NumpyBackend(model, "native", precision), model, ids, 12) for precision in ("exact", "fast")]
    matched = agreement(*outs, 12).matched
    assert sorted(matched)[len(matched) // 2] >= 6 and max(matched) == 12, matched
