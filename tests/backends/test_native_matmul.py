"""The C projection kernel (matmul_rows.c) against NumPy's x @ w.T, on every CPU tier this host runs, and when it
hands over to NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul
from tests.backends.bounds import assert_within, dot_bound

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips


@pytest.fixture(scope="module")
def matmul(kernel_cache: Path, tier: CpuTier) -> NativeMatmul:
    return NativeMatmul(cache_dir=kernel_cache, tier=tier)


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
    # within float32's worst case for sums of this length (bounds.py), whatever the tier's lanes and FMA
    assert_within(out, x.astype(np.float64) @ w.T.astype(np.float64), dot_bound(x, w))


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
    again = NativeMatmul(cache_dir=matmul.library_path.parent, tier=matmul.tier)
    assert again.library_path == matmul.library_path and again.library_path.stat().st_mtime_ns == built
