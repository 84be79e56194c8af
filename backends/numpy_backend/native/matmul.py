"""ctypes binding of matmul_rows.c: the decode step's projections, x @ w.T for a few rows of x, with w float32 or
as the GGUF file stores it; and the dequantization of a stored matrix for steps too large for them.

The C kernels run on libgomp's thread team, which does not survive fork(): a child process that runs them
must be started by exec or the "spawn" method (nothing in pagedserve forks without exec)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.quant import Matrix, QuantMatrix, dense
from backends.numpy_backend.native.arrays import is_c_array
from backends.numpy_backend.native.build import SOURCE_DIR, build_library
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier
from backends.numpy_backend.native.weights import EXACT_ONLY, c_weights, readable

Projection = Callable[[np.ndarray, Matrix], np.ndarray]  # (x, w) -> x @ w.T

LANES = 8  # k must be a multiple of this (matmul_rows.c's LANES)
# Up to this many rows the C kernel is at least as fast as OpenBLAS GEMM here (the 113 MB output head: 64 rows
# 31.7 vs 32.2 ms; 32 rows 18.2 vs 26.0 ms), and only it gives a row the same result in any batch; see
# docs/PERFORMANCE.md. The fused step (fused_step.py) takes steps of up to as many tokens.
MAX_ROWS = 64


class NativeMatmul:
    """`project(x, w)` = x @ w.T: the C kernel when x has 1..max_rows rows of C-contiguous float32 and the
    kernel reads w as it is (weights.readable); NumPy (BLAS) otherwise, on w dequantized by `dense` when it is
    stored quantized (the per-call float32 copy of one matrix, never kept). With `fast`, the fast precision
    (fast_matmul.h): on a CPU whose AMX tiles the process may use, for any number of rows; on every tier but
    generic, steps of 1-3 rows on Q4_0 / Q4_1 weights with 8-bit x (q8_dots.h). Weights of the EXACT_ONLY types
    (Q5_0, Q5_1, the K-quants) are exact in either precision."""

    def __init__(self, max_rows: int = MAX_ROWS, cache_dir: Path | None = None, fast: bool = False,
                 library_path: Path | None = None, tier: CpuTier | None = None) -> None:
        """tier: the CPU tier to build for (cpu_tiers.py); None: the highest this CPU runs. library_path: a build
        of matmul_rows.c to bind instead (the tests run builds for other targets through it)."""
        self.tier = tier or host_tier()
        self.library_path = library_path or build_library(SOURCE_DIR / "matmul_rows.c", self.tier, cache_dir)
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
        self.fast_uses_tiles = bool(library.fast_uses_tiles())  # AMX: else larger steps are exact in fast
        self.fast_small_steps = bool(library.fast_small_steps())  # not on generic: small steps exact in fast
        self.fast = fast and (self.fast_uses_tiles or self.fast_small_steps)
        self.max_rows = max_rows
        self.threaded = bool(library.built_with_openmp())  # False: built without OpenMP, one thread

    def project(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        tiles = self.fast and self.fast_uses_tiles and not (isinstance(w, QuantMatrix) and w.qtype in EXACT_ONLY)
        if not self._fits(x, w, tiles):
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

    def fast_paths(self) -> str:
        """What the fast precision runs on this machine, in words."""
        tier = self.tier.name
        tiles = "bfloat16 products on AMX tiles" if self.fast_uses_tiles else f"exact (no AMX tiles on {tier})"
        small = "8-bit x, integer dot products" if self.fast_small_steps else f"exact (no 8-bit path on {tier})"
        exact = ", ".join(sorted(t.name for t in EXACT_ONLY))
        return (f"steps of 4 rows or more: {tiles}; steps of 1-3 rows on Q4_0 / Q4_1 weights: {small}; "
                f"{exact} weights: exact")

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


def q8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (m, k) rounded per block of 32 as the fast precision's small steps round it (q8_dots.h): the integers
    (m, k / 32, 32) and each block's scale max |x| / 127 (m, k / 32), in float32 as C computes them."""
    blocks = np.ascontiguousarray(x, np.float32).reshape(x.shape[0], -1, 32)
    scale = np.abs(blocks).max(axis=2) / np.float32(127)
    inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    return np.rint(blocks * inverse[..., None]).astype(np.int64), scale


def q4_parts(w: QuantMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_0 / Q4_1 matrix's 4-bit integers (n, k / 32, 32), scales dw and offsets (n, k / 32) such that each
    weight is dw * q + offset: gguf's block layouts read directly."""
    n, blocks = w.shape[0], w.shape[1] // 32
    raw = w.data.reshape(n, blocks, -1)
    d = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    start = 4 if w.qtype == GGMLQuantizationType.Q4_1 else 2
    q = np.concatenate([raw[..., start:] & 0x0F, raw[..., start:] >> 4], axis=2).astype(np.int64)
    if w.qtype == GGMLQuantizationType.Q4_1:
        return q, d, raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return q, d, -8.0 * d


def q8_reference(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    """The fast precision's small-step product in NumPy, in float64: x rounded (q8_rows), each block's integer
    dot product exact, then dw * dx * dot + offset * dx * sum(qx) (the reference of q8_dots.h)."""
    qx, dx = q8_rows(x)
    qw, dw, offset = q4_parts(w)
    dots = np.einsum("mbk,nbk->mnb", qx, qw).astype(np.float64)
    sx = dx.astype(np.float64) * qx.sum(axis=2)
    return np.einsum("mnb,nb,mb->mn", dots, dw, dx.astype(np.float64)) + np.einsum("nb,mb->mn", offset, sx)
