"""The C projection kernel (matmul_rows.c) against NumPy's x @ w.T, and when it hands over to NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips


@pytest.fixture(scope="module")
def matmul(tmp_path_factory: pytest.TempPathFactory) -> NativeMatmul:
    return NativeMatmul(cache_dir=tmp_path_factory.mktemp("kernels"))


def problem(rows: int, inner: int, outputs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, inner), dtype=np.float32),
            rng.standard_normal((outputs, inner), dtype=np.float32))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 10, MAX_ROWS])
@pytest.mark.parametrize(("inner", "outputs"), [(8, 8), (64, 13), (576, 960), (1536, 577), (16, 3)])
def test_matches_numpy(matmul: NativeMatmul, rows: int, inner: int, outputs: int) -> None:
    """Every tile of 8 weight rows and the tail rows past the last tile (13, 577, 3 outputs)."""
    x, w = problem(rows, inner, outputs, seed=rows * inner + outputs)
    out = matmul.project(x, w)
    assert out.shape == (rows, outputs) and out.dtype == np.float32 and out.flags.c_contiguous
    # n-term float32 sums of products of standard normals (outputs ~sqrt(n)): a sequential sum's error is about
    # n / sqrt(2) * 2^-24 (1.7e-6 * sqrt(n) at n = 1536), lane-split ones less; measured up to 1.4e-6 * sqrt(n) here
    # (NumPy's own 2.2e-6), at most 0.51 of this tolerance (AVX2 host)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5,
                               atol=2e-6 * np.sqrt(inner))


@pytest.mark.parametrize(("inner", "outputs"), [(64, 40), (16, 13), (576, 577), (8, 3)])
def test_rows_are_independent(matmul: NativeMatmul, inner: int, outputs: int) -> None:
    """A sequence's projection does not depend on which other rows share the step, bit for bit: one or two rows
    go through 8-row tiles, more through register blocks, tails one weight row at a time, all summing alike."""
    x, w = problem(11, inner, outputs)
    alone = np.concatenate([matmul.project(x[i : i + 1], w) for i in range(11)])
    for rows in range(2, 12):
        np.testing.assert_array_equal(matmul.project(x[:rows], w), alone[:rows])


def misaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` one byte off float32 alignment."""
    buffer = bytearray(a.nbytes + 1)
    out = np.frombuffer(buffer, a.dtype, count=a.size, offset=1).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("case", ["too many rows", "no rows", "inner not a multiple of 8", "inner of 0", "float64",
                                  "x not contiguous", "w not contiguous", "x misaligned"])
def test_hands_over_to_numpy(matmul: NativeMatmul, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    x, w = {
        "too many rows": problem(MAX_ROWS + 1, 16, 8),
        "no rows": problem(0, 16, 8),
        "inner not a multiple of 8": problem(2, 12, 8),
        "inner of 0": problem(2, 0, 8),
        "x misaligned": (misaligned(problem(2, 16, 8)[0]), problem(2, 16, 8)[1]),
        "float64": tuple(a.astype(np.float64) for a in problem(2, 16, 8)),
        "x not contiguous": (problem(2, 32, 8)[0][:, ::2], problem(2, 16, 8)[1]),
        "w not contiguous": (problem(2, 16, 8)[0], problem(2, 16, 16)[1][::2]),
    }[case]

    def not_called(*args: object) -> int:
        raise AssertionError("the C kernel was called")

    monkeypatch.setattr(matmul, "_fn", not_called)
    np.testing.assert_array_equal(matmul.project(x, w), x @ w.T)


def test_the_kernel_checks_its_sizes(matmul: NativeMatmul) -> None:
    x, w = problem(2, 12, 8)
    out = np.empty((2, 8), np.float32)
    f32 = 0  # ggml's type id of float32
    assert matmul._fn(x.ctypes.data, w.ctypes.data, 48, f32, out.ctypes.data, 2, 12, 8, 0) == -2
    assert matmul._fn(x.ctypes.data, w.ctypes.data, 32, f32, out.ctypes.data, -1, 8, 8, 0) == -2


def test_a_second_instance_reuses_the_built_library(matmul: NativeMatmul) -> None:
    built = matmul.library_path.stat().st_mtime_ns
    again = NativeMatmul(cache_dir=matmul.library_path.parent)
    assert again.library_path == matmul.library_path and again.library_path.stat().st_mtime_ns == built
