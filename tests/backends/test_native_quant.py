"""The projections and the dequantization over weights kept as the GGUF file stores them (quant.h, quant_k.h,
quant_matmul.h, quant_wide.h), against gguf's NumPy dequantization, for every type, every path (tiles of 1-2
rows, register blocks of 3+, tail rows) and widths past whole blocks where the format allows them: the float32
copy's results bit for bit where the sums run in 8 lanes, within float32 rounding of them where they run in 16
(AVX-512), and always the same result for a row whatever its batch; on every CPU tier this host runs (the
avx2 tier's run is the check of the paths without AVX-512 on a host that has it). gguf cannot quantize the
K-quants: their matrices are random bytes with finite float16 scales (random_blocks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from backends.model.quant import QuantMatrix
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul
from backends.numpy_backend.native.weights import EIGHT_LANES_ONLY, STORED_TYPES, readable
from tests.backends.bounds import assert_within, dot_bound
from tests.backends.tiers import WIDE_SUMS

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
QUANTIZED = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, *K_QUANTS)
FLOATS = (Q.F16, Q.BF16)
QBLOCK, QK_K = 32, 256  # weights per block of the quantized types, per K-quant super-block
# the float16 scales of each type's blocks: (byte offset, spread of the random values' magnitudes)
HALF_SCALES = {Q.Q2_K: ((80, 0.02), (82, 0.01)), Q.Q3_K: ((108, 0.01),), Q.Q4_K: ((0, 0.01), (2, 0.01)),
               Q.Q5_K: ((0, 0.005), (2, 0.01)), Q.Q6_K: ((208, 0.005),)}


@pytest.fixture(scope="module")
def matmul(kernel_cache: Path, tier: CpuTier) -> NativeMatmul:
    return NativeMatmul(cache_dir=kernel_cache, tier=tier)


def test_the_tier_sums_in_the_lanes_it_should(matmul: NativeMatmul) -> None:
    """16 lanes exactly on the AVX-512 tiers: a build that lost its wide path (or gained one) fails here."""
    assert matmul.wide_sums == (matmul.tier.name in WIDE_SUMS)


def stored(qtype: Q, rows: int, cols: int, seed: int = 0) -> QuantMatrix:
    if qtype in K_QUANTS:
        return random_blocks(qtype, rows, cols, seed)
    values = np.random.default_rng(seed).normal(0, 0.3, (rows, cols)).astype(np.float32)
    values[:, :3] += 2.0  # blocks with an offset, so Q4_1's m is far from 0
    return QuantMatrix.quantize(values, qtype)


def random_blocks(qtype: Q, rows: int, cols: int, seed: int = 0) -> QuantMatrix:
    """A K-quant matrix of random bytes, its float16 scales (d, dmin) finite, of either sign, weights of a few
    units: every integer, scale and min the format holds occurs."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // QK_K, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    for at, spread in HALF_SCALES[qtype]:
        halves = rng.normal(0, spread, data.shape[:2]).astype(np.float16)
        data[..., at : at + 2] = halves.view(np.uint8).reshape(*data.shape[:2], 2)
    return QuantMatrix(qtype, (rows, cols), np.ascontiguousarray(data.reshape(rows, -1)))


def width(qtype: Q, cols: int) -> int:
    """cols rounded up to whole super-blocks for the K-quants (their rows are), else itself."""
    return -(-cols // QK_K) * QK_K if qtype in K_QUANTS else cols


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


SHAPES = [(32, 8), (64, 13), (576, 960), (1536, 577), (96, 3)]  # (inner, outputs): tiles, strips and tails
K_SHAPES = [(256, 8), (512, 13), (768, 960), (1536, 577), (256, 3)]  # the same, in whole super-blocks


def shapes_for(qtype: Q) -> list[tuple[int, int]]:
    return K_SHAPES if qtype in K_QUANTS else SHAPES


@pytest.mark.parametrize(("qtype", "inner", "outputs"),
                         [(qtype, *shape) for qtype in QUANTIZED + FLOATS for shape in shapes_for(qtype)],
                         ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 17, MAX_ROWS])
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


# where each type's block holds its float16 d, and its other float16s (Q4_1 / Q5_1's m, the K-quants' dmin)
D_AT = {Q.Q4_0: 0, Q.Q4_1: 0, Q.Q8_0: 0, Q.Q5_0: 0, Q.Q5_1: 0, Q.Q2_K: 80, Q.Q3_K: 108, Q.Q4_K: 0, Q.Q5_K: 0,
        Q.Q6_K: 208}
OTHER_HALVES = {Q.Q4_1: (2,), Q.Q5_1: (2,), Q.Q2_K: (82,), Q.Q4_K: (2,), Q.Q5_K: (2,)}


def every_half_scale(qtype: Q, seed: int = 0) -> QuantMatrix:
    """One block (K-quants: super-block) per row, its d every finite float16 (subnormals and both zeros among
    them), its other float16s (m, dmin) each finite value too in another order, the rest random bytes (so
    every integer, scale and min: Q2_K's 4-bit, Q3_K's and Q4_K's 6-bit, Q6_K's 8-bit, occur with many d)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    scales = bits[np.isfinite(bits.view(np.float16))]
    rng = np.random.default_rng(seed)
    cols, block_bytes = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (len(scales), block_bytes), dtype=np.uint8)
    data[:, D_AT[qtype] : D_AT[qtype] + 2] = scales.view(np.uint8).reshape(-1, 2)
    for at in OTHER_HALVES.get(qtype, ()):
        data[:, at : at + 2] = rng.permutation(scales).view(np.uint8).reshape(-1, 2)
    return QuantMatrix(qtype, (len(scales), cols), np.ascontiguousarray(data))


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_every_half_scale_dequantizes_as_gguf(matmul: NativeMatmul, qtype: Q) -> None:
    """d * q + m (or d * (q - 8), d * q; the K-quants' (d * sc) * q - dmin * mn) computed as one FMA on some
    tiers: the same value as gguf's two roundings only because the product is exact in float32 (a float16 d has
    11 significant bits, q at most 8, d * sc at most 17 and q then 5), which this checks for every d the format
    can hold. Q6_K's (d * scale) * q, which may round, must be gguf's one product; Q3_K's, exact, its value."""
    w = every_half_scale(qtype)
    np.testing.assert_array_equal(matmul.dense(w), w.dequantize())


@pytest.mark.parametrize("qtype", QUANTIZED + FLOATS, ids=lambda t: t.name)
def test_dequantize_matches_gguf(matmul: NativeMatmul, qtype: Q) -> None:
    w = stored(qtype, 77, width(qtype, 576))
    dense = matmul.dense(w)
    assert dense.dtype == np.float32 and dense.flags.c_contiguous
    np.testing.assert_array_equal(dense, w.dequantize())


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_rows_are_independent(matmul: NativeMatmul, qtype: Q) -> None:
    """A row's result does not depend on what else is in the batch, bit for bit (as with float32 weights)."""
    w, x = stored(qtype, 577, width(qtype, 64)), activations(11, width(qtype, 64))
    alone = np.concatenate([matmul.project(x[i : i + 1], w) for i in range(11)])
    for rows in range(2, 12):
        np.testing.assert_array_equal(matmul.project(x[:rows], w), alone[:rows])


def test_larger_steps_use_blas_on_a_transient_float32_copy(matmul: NativeMatmul) -> None:
    w, x = stored(Q.Q4_1, 40, 64), activations(MAX_ROWS + 1, 64)
    # the same BLAS product of the same float32 copy: equal here; 1e-5 (outputs up to 15) allows a BLAS that picks
    # another kernel for the copy's alignment
    np.testing.assert_allclose(matmul.project(x, w), x @ w.dequantize().T, rtol=1e-5, atol=1e-5)


def no_kernel_matrix() -> QuantMatrix:
    """An MXFP4 matrix (no kernel reads the type), its bytes zeros."""
    block, block_bytes = GGML_QUANT_SIZES[Q.MXFP4]
    return QuantMatrix(Q.MXFP4, (8, QK_K), np.zeros((8, QK_K // block * block_bytes), np.uint8))


def test_a_type_without_kernels_is_not_readable() -> None:
    assert not readable(no_kernel_matrix())
    assert readable(stored(Q.Q8_0, 8, 64)) and not readable(np.zeros((8, 12), np.float32))
    assert all(readable(stored(qtype, 8, width(qtype, 64))) for qtype in QUANTIZED)
    assert set(QUANTIZED + FLOATS) == STORED_TYPES


def call_status(matmul: NativeMatmul, qtype: Q, inner: int) -> int:
    """What matmul_weights_f32 returns for one row of x and 8 weight rows of `qtype` (zeros), `inner` wide."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    data = np.zeros((8, -(-inner // block) * block_bytes), np.uint8)
    return int(matmul._fn(activations(1, inner).ctypes.data, data.ctypes.data, data.shape[1], int(qtype),
                          np.empty(8, np.float32).ctypes.data, 1, inner, 8, 0))


def test_the_kernel_refuses_what_it_cannot_read(matmul: NativeMatmul) -> None:
    assert call_status(matmul, Q.MXFP4, QK_K) == -2


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_rows_the_format_cannot_hold_are_refused(matmul: NativeMatmul, qtype: Q) -> None:
    """K-quant rows are whole super-blocks of 256, the others' whole blocks of 32: the kernel refuses any other
    width, and so does a QuantMatrix."""
    multiple = QK_K if qtype in K_QUANTS else QBLOCK
    for inner in (multiple // 2, multiple + 32 if multiple == QK_K else multiple + 8):
        assert call_status(matmul, qtype, inner) == -2
        with pytest.raises(ValueError, match=qtype.name):
            QuantMatrix(qtype, (8, inner), np.zeros((8, 144), np.uint8))
    assert call_status(matmul, qtype, 2 * multiple) == 0


@pytest.mark.parametrize("qtype", sorted(EIGHT_LANES_ONLY), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [5, MAX_ROWS + 1])
def test_the_fast_precision_is_exact_on_these_types_from_4_rows(matmul_for: Callable[[CpuTier, bool], NativeMatmul],
                                                                tier: CpuTier, qtype: Q, rows: int) -> None:
    """No AMX tiles, no 16 lanes: fast gives the exact precision's floats in steps of 4 rows and more (those of
    1-3, and on the AVX-512 tiers those of 4-64, which run the 8-bit path instead: test_native_fast), and says
    so."""
    fast, exact = matmul_for(tier, True), matmul_for(tier, False)
    w, x = stored(qtype, 45, width(qtype, 576)), activations(rows, width(qtype, 576))
    before = fast.small_steps_run()
    out = fast.project(x, w)
    if fast.fast_wide_steps and rows <= 64:
        assert fast.small_steps_run() == before + 1
    else:
        np.testing.assert_array_equal(out, exact.project(x, w))
    larger, smaller = fast.fast_paths().split(";")[:2]
    assert qtype.name in smaller and (qtype.name in larger or not fast.fast_uses_tiles)
