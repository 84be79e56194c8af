"""The projections and the dequantization over weights kept as the GGUF file stores them (quant.h,
quant_matmul.h, quant_wide.h), against gguf's NumPy dequantization, for every type, every path (tiles of 1-2
rows, register blocks of 3+, tail rows) and widths past whole blocks where the format allows them: the float32
copy's results bit for bit where the sums run in 8 lanes, within float32 rounding of them where they run in 16
(AVX-512), and always the same result for a row whatever its batch; on every CPU tier this host runs (the
avx2 tier's run is the check of the paths without AVX-512 on a host that has it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from backends.model.quant import QuantMatrix
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul
from backends.numpy_backend.native.weights import readable
from tests.backends.bounds import assert_within, dot_bound
from tests.backends.tiers import WIDE_SUMS

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
QUANTIZED = (Q.Q4_0, Q.Q4_1, Q.Q8_0)
FLOATS = (Q.F16, Q.BF16)
QBLOCK = 32  # weights per block of the quantized types


@pytest.fixture(scope="module")
def matmul(kernel_cache: Path, tier: CpuTier) -> NativeMatmul:
    return NativeMatmul(cache_dir=kernel_cache, tier=tier)


def test_the_tier_sums_in_the_lanes_it_should(matmul: NativeMatmul) -> None:
    """16 lanes exactly on the AVX-512 tiers: a build that lost its wide path (or gained one) fails here."""
    assert matmul.wide_sums == (matmul.tier.name in WIDE_SUMS)


def stored(qtype: Q, rows: int, cols: int, seed: int = 0) -> QuantMatrix:
    values = np.random.default_rng(seed).normal(0, 0.3, (rows, cols)).astype(np.float32)
    values[:, :3] += 2.0  # blocks with an offset, so Q4_1's m is far from 0
    return QuantMatrix.quantize(values, qtype)


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


SHAPES = [(32, 8), (64, 13), (576, 960), (1536, 577), (96, 3)]  # (inner, outputs): tiles, strips and tails


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize(("inner", "outputs"), SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17, MAX_ROWS])
def test_the_float32_copys_results(matmul: NativeMatmul, qtype: Q, inner: int, outputs: int, rows: int) -> None:
    w = stored(qtype, outputs, inner, seed=inner + outputs)
    x = activations(rows, inner, seed=rows)
    reference = w.dequantize()  # gguf's NumPy dequantization
    out = matmul.project(x, w)
    assert_same_as_copy(matmul, out, matmul.project(x, reference), x, reference)
    assert_within(out, x.astype(np.float64) @ reference.T.astype(np.float64), dot_bound(x, reference))


def assert_same_as_copy(matmul: NativeMatmul, out: np.ndarray, copy: np.ndarray, x: np.ndarray, w: np.ndarray
                        ) -> None:
    """Bit for bit in 8 lanes; in 16, within the float32 rounding of the sums' order (the dot product of the
    magnitudes times a few units in the last place)."""
    if not matmul.wide_sums or w.shape[1] % 16:
        np.testing.assert_array_equal(out, copy)
        return
    bound = 4 * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
    assert np.all(np.abs(out.astype(np.float64) - copy) <= bound)


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize("inner", [8, 40, 72, 584])  # not whole blocks of 32: the formats allow it
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_float16_types_past_whole_blocks(matmul: NativeMatmul, qtype: Q, inner: int, rows: int) -> None:
    w, x = stored(qtype, 19, inner, seed=inner), activations(rows, inner)
    assert readable(w)
    assert_same_as_copy(matmul, matmul.project(x, w), matmul.project(x, w.dequantize()), x, w.dequantize())


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
def test_every_16_bit_pattern_converts_exactly(matmul: NativeMatmul, qtype: Q) -> None:
    """Subnormals, both zeros, the extremes: every finite value of the type, through the dequantization."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16).astype(np.float32) if qtype == Q.F16 else (
        bits.astype(np.uint32) << 16).view(np.float32)
    finite = bits[np.isfinite(values)]
    data = finite[: len(finite) // 64 * 64].view(np.uint8).reshape(-1, 128)  # rows of 64 values
    w = QuantMatrix(qtype, (len(data), 64), np.ascontiguousarray(data))
    np.testing.assert_array_equal(matmul.dense(w), w.dequantize())


def every_half_scale(qtype: Q, seed: int = 0) -> QuantMatrix:
    """One block per row, its d every finite float16 (subnormals and both zeros among them), its m (Q4_1) and q
    random: rows of 32 weights."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    scales = bits[np.isfinite(bits.view(np.float16))]
    rng = np.random.default_rng(seed)
    tail = {Q.Q4_0: 16, Q.Q4_1: 18, Q.Q8_0: 32}[qtype]  # bytes after d: (m and) the weights
    data = np.concatenate([scales.view(np.uint8).reshape(-1, 2),
                           rng.integers(0, 256, (len(scales), tail), dtype=np.uint8)], axis=1)
    if qtype == Q.Q4_1:  # m: a finite float16 too
        data[:, 2:4] = rng.choice(scales, len(scales)).view(np.uint8).reshape(-1, 2)
    return QuantMatrix(qtype, (len(scales), QBLOCK), np.ascontiguousarray(data))


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_every_half_scale_dequantizes_as_gguf(matmul: NativeMatmul, qtype: Q) -> None:
    """d * q + m (or d * (q - 8), d * q) computed as one FMA on some tiers: the same value as gguf's two
    roundings only because d * q is exact in float32 (a float16 d has 11 significant bits, q at most 8), which
    this checks for every d the format can hold."""
    w = every_half_scale(qtype)
    np.testing.assert_array_equal(matmul.dense(w), w.dequantize())


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS, ids=lambda t: t.name)
def test_dequantize_matches_gguf(matmul: NativeMatmul, qtype: Q) -> None:
    w = stored(qtype, 77, 576)
    dense = matmul.dense(w)
    assert dense.dtype == np.float32 and dense.flags.c_contiguous
    np.testing.assert_array_equal(dense, w.dequantize())


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_rows_are_independent(matmul: NativeMatmul, qtype: Q) -> None:
    """A row's result does not depend on what else is in the batch, bit for bit (as with float32 weights)."""
    w, x = stored(qtype, 577, 64), activations(11, 64)
    alone = np.concatenate([matmul.project(x[i : i + 1], w) for i in range(11)])
    for rows in range(2, 12):
        np.testing.assert_array_equal(matmul.project(x[:rows], w), alone[:rows])


def test_larger_steps_use_blas_on_a_transient_float32_copy(matmul: NativeMatmul) -> None:
    w, x = stored(Q.Q4_1, 40, 64), activations(MAX_ROWS + 1, 64)
    # the same BLAS product of the same float32 copy: equal here; 1e-5 (outputs up to 15) allows a BLAS that picks
    # another kernel for the copy's alignment
    np.testing.assert_allclose(matmul.project(x, w), x @ w.dequantize().T, rtol=1e-5, atol=1e-5)


def test_a_type_without_kernels_is_not_readable() -> None:
    assert not readable(stored(Q.Q5_0, 8, 64))
    assert readable(stored(Q.Q8_0, 8, 64)) and not readable(np.zeros((8, 12), np.float32))


def test_the_kernel_refuses_what_it_cannot_read(matmul: NativeMatmul) -> None:
    w = stored(Q.Q4_0, 8, 64)
    status = matmul._fn(activations(1, 64).ctypes.data, w.data.ctypes.data, w.row_bytes, int(Q.Q5_0),
                        np.empty(8, np.float32).ctypes.data, 1, 64, 8, 0)
    assert status == -2
