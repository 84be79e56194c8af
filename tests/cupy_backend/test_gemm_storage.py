"""bfloat16 storage as bits and the GEMMs over it, including the cuBLAS call's column-major mapping (checked
against a host stand-in for cublasGemmEx)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.cupy_backend.gemm import CublasBf16Gemm, MatmulGemm, UpcastBf16Gemm, agrees, choose_gemm
from backends.cupy_backend.storage import bf16_decode, bf16_encode, storage_for
from tests.cuda.dtypes import bf16_bits
from tests.cupy_backend.fakes import FakeCublas, device, fake_cupy

RNG = np.random.default_rng(0)


def test_bf16_encode_rounds_like_the_kernel_tests() -> None:
    x = np.concatenate([RNG.standard_normal(4096) * 10.0 ** RNG.integers(-8, 8, 4096), [0.0, -0.0, 1e38, -3.5]])
    x = x.astype(np.float32)
    assert np.array_equal(bf16_encode(np, x), bf16_bits(x))
    assert np.array_equal(bf16_decode(np, bf16_bits(x)), (bf16_bits(x).astype(np.uint32) << 16).view(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_storage_round_trip_is_within_one_rounding(dtype: str) -> None:
    s = storage_for(dtype)
    x = RNG.standard_normal(1000).astype(np.float32)
    stored = s.encode(np, x)
    assert stored.dtype == s.dtype and stored.itemsize == s.itemsize
    rel = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]  # each type's unit roundoff
    np.testing.assert_allclose(s.decode(np, stored), x, rtol=rel, atol=1e-7)


def test_upcast_bf16_gemm_is_the_rounded_float32_product() -> None:
    x, w = (bf16_encode(np, RNG.standard_normal(s).astype(np.float32)) for s in ((5, 64), (24, 64)))
    xd, wd = (bf16_decode(np, a).astype(np.float64) for a in (x, w))
    exact = xd @ wd.T
    g = UpcastBf16Gemm(np)
    # bfloat16 products are exact in float32, so only the 64-term sums round: sqrt(64) * 2^-24 of the terms' sizes,
    # typical for any summation order (2.6e-5 here; measured 1.2e-6)
    sizes = float((np.abs(xd) @ np.abs(wd).T).max())
    np.testing.assert_allclose(g.logits(x, w), exact, rtol=0, atol=np.sqrt(64) * 2.0**-24 * sizes)
    # the float32 product rounded once to bfloat16: at most half its 2^-7 step, 2^-8 of the value
    np.testing.assert_allclose(bf16_decode(np, g.linear(x, w)), exact, rtol=2.0**-8, atol=1e-6)


def test_cublas_bf16_gemm_maps_row_major_onto_column_major() -> None:
    cublas = FakeCublas()
    gemm = CublasBf16Gemm(fake_cupy(), cublas=cublas)
    x = device(bf16_encode(np, RNG.standard_normal((3, 40)).astype(np.float32)))
    w = device(bf16_encode(np, RNG.standard_normal((7, 40)).astype(np.float32)))
    reference = UpcastBf16Gemm(np)
    # the fake cuBLAS sums with NumPy (equal here); 1e-5 leaves room for another float32 summation order
    np.testing.assert_allclose(gemm.logits(x, w), reference.logits(x, w), rtol=1e-5, atol=1e-5)
    assert gemm.logits(x, w).dtype == np.float32 and gemm.linear(x, w).dtype == np.uint16
    np.testing.assert_array_equal(gemm.linear(x, w), reference.linear(x, w))
    assert cublas.pointer_mode == 1 and 0 in cublas.modes_seen  # host mode during the call, then restored


def test_cublas_gemm_refuses_mismatched_shapes() -> None:
    gemm = CublasBf16Gemm(fake_cupy(), cublas=FakeCublas())
    with pytest.raises(ValueError, match="do not match"):
        gemm.linear(device(np.zeros((2, 8), np.uint16)), device(np.zeros((3, 16), np.uint16)))


def test_choose_gemm() -> None:
    assert isinstance(choose_gemm(np, storage_for("float32")), MatmulGemm)
    assert isinstance(choose_gemm(np, storage_for("float16")), MatmulGemm)
    assert isinstance(choose_gemm(np, storage_for("bfloat16")), UpcastBf16Gemm)


def test_choose_gemm_falls_back_when_cublas_is_unusable(caplog: pytest.LogCaptureFixture) -> None:
    """Not NumPy, and no cupy_backends to import here: the exact upcast path, with a warning."""
    assert isinstance(choose_gemm(fake_cupy(), storage_for("bfloat16")), UpcastBf16Gemm)
    assert "widening to float32" in caplog.text


def test_agreement_check_rejects_a_wrong_gemm() -> None:
    class Scaled(UpcastBf16Gemm):
        def logits(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
            return super().logits(x, w) * 1.01

    assert agrees(np, UpcastBf16Gemm(np), UpcastBf16Gemm(np))
    assert not agrees(np, Scaled(np), UpcastBf16Gemm(np))
