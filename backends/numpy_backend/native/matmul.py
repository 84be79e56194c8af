"""ctypes binding of matmul_rows.c: the decode step's projections, x @ w.T for a few rows of x, with w float32 or
as the GGUF file stores it; and the dequantization of a stored matrix for steps too large for them.

The C kernels run on libgomp's thread team, which does not survive fork(): a child process that runs them
must be started by exec or the "spawn" method (nothing in pagedserve forks without exec)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np

from backends.model.quant import Matrix, QuantMatrix, dense
from backends.numpy_backend.native.arrays import is_c_array
from backends.numpy_backend.native.build import SOURCE_DIR, build_library
from backends.numpy_backend.native.weights import c_weights, readable

Projection = Callable[[np.ndarray, Matrix], np.ndarray]  # (x, w) -> x @ w.T

LANES = 8  # k must be a multiple of this (matmul_rows.c's LANES)
# Up to this many rows the C kernel is at least as fast as OpenBLAS GEMM here (the 113 MB output head: 64 rows
# 31.7 vs 32.2 ms; 32 rows 18.2 vs 26.0 ms), and only it gives a row the same result in any batch; see
# docs/PERFORMANCE.md. The fused step (fused_step.py) takes steps of up to as many tokens.
MAX_ROWS = 64


class NativeMatmul:
    """`project(x, w)` = x @ w.T: the C kernel when x has 1..max_rows rows of C-contiguous float32 and the
    kernel reads w as it is (weights.readable); NumPy (BLAS) otherwise, on w dequantized by `dense` when it is
    stored quantized (the per-call float32 copy of one matrix, never kept). With `fast` on a CPU whose AMX
    tiles the process may use, the fast precision's kernel (fast_matmul.h) for any number of rows."""

    def __init__(self, max_rows: int = MAX_ROWS, cache_dir: Path | None = None, fast: bool = False) -> None:
        self.library_path = build_library(SOURCE_DIR / "matmul_rows.c", cache_dir)
        library = ctypes.CDLL(str(self.library_path))
        self._fn = library.matmul_weights_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self._dequantize = library.dequantize_f32
        self._dequantize.restype = ctypes.c_int
        self._dequantize.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64]
        # stored weights summed in 16 lanes: their results differ from the float32 copy's by float32 rounding
        self.wide_sums = bool(library.quant_sums_wide())
        self.fast_uses_tiles = bool(library.fast_uses_tiles())  # AMX: else the fast precision is the exact one
        self.fast = fast and self.fast_uses_tiles
        self.max_rows = max_rows
        self.threaded = bool(library.built_with_openmp())  # False: built without OpenMP, one thread

    def project(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        if not self._fits(x, w, self.fast):
            return x @ self.dense(w).T
        rows, inner = x.shape
        out = np.empty((rows, w.shape[0]), np.float32)
        desc = c_weights(w)
        status = self._fn(x.ctypes.data, desc.data, desc.row_bytes, desc.type, out.ctypes.data, rows, inner,
                          w.shape[0], int(self.fast))
        if status != 0:
            raise (MemoryError if status == -1 else ValueError)(
                f"native matmul: status {status} for x {x.shape}, w {w.shape}")
        return out

    def dense(self, w: Matrix) -> np.ndarray:
        """w as float32: itself, or dequantized by the kernels' threads when the C kernel reads its type."""
        if not isinstance(w, QuantMatrix):
            return w
        if not readable(w):
            return w.dequantize()
        out = np.empty(w.shape, np.float32)
        if self._dequantize(w.data.ctypes.data, w.row_bytes, int(w.qtype), out.ctypes.data, *w.shape) != 0:
            raise ValueError(f"native dequantize: {w.qtype.name} {w.shape}")
        return out

    def _fits(self, x: np.ndarray, w: Matrix, any_rows: bool) -> bool:
        return (x.ndim == 2 and len(w.shape) == 2 and 0 < x.shape[0] and (any_rows or x.shape[0] <= self.max_rows)
                and x.shape[1] == w.shape[1] and x.shape[1] > 0 and x.shape[1] % LANES == 0
                and is_c_array(x, np.float32) and readable(w))


def to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even) and widened back: the fast precision's
    inputs."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return rounded.view(np.float32).reshape(a.shape)


def fast_reference(x: np.ndarray, w: Matrix) -> np.ndarray:
    """The fast precision's tile product in NumPy: x and w rounded to bfloat16, the product of the rounded values
    in float32 (the reference of fast_matmul.h's tiles)."""
    return to_bfloat16(x) @ to_bfloat16(dense(w)).T


def numpy_project(x: np.ndarray, w: Matrix) -> np.ndarray:
    """The reference projection: x (T, k) @ w.T for a weight stored (n, k), dequantized by gguf when quantized."""
    return x @ dense(w).T
