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
from backends.numpy_backend.native.grouped_q8 import GroupedMatrix
from backends.numpy_backend.native.weights import (
    EIGHT_LANES_ONLY,
    LANE_STEP_TYPES,
    SMALL_STEP_TYPES,
    TILED_SMALL_STEP_TYPES,
    c_weights,
    readable,
)

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
    (fast_matmul.h): on a CPU whose AMX tiles the process may use, for any number of rows (not on the
    EIGHT_LANES_ONLY types: Q5_0, Q5_1, the K-quants); on every tier but generic, steps of 1-3 rows on the
    SMALL_STEP_TYPES (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants) with 8-bit x (q8_dots.h, q8_k.h, q8_k23.h,
    q8_lanes.h); on the AVX-512 VNNI tiers, any steps on Q8_0 and Q5_0 matrices regrouped at load (GroupedMatrix,
    q8_grouped.h), with the stored matrix's results. Other steps are exact."""

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
        self.fast_wide_steps = bool(library.fast_wide_steps())  # AVX-512: steps of 4-64 rows on the 8-bit path too
        self.fast_lane_steps = bool(library.fast_lane_steps())  # AVX-512 VNNI: Q8_0 / K-quants, x in lanes, any rows
        self.groups_q8 = fast and bool(library.fast_grouped_q8())  # AVX-512 VNNI: Q8_0 regrouped (q8_grouped.h)
        self._small_steps_run = library.fast_small_steps_run
        self._small_steps_run.restype = ctypes.c_int64
        self.fast = fast and (self.fast_uses_tiles or self.fast_small_steps)
        self.max_rows = max_rows
        self.threaded = bool(library.built_with_openmp())  # False: built without OpenMP, one thread

    def project(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        tiles = self.fast and self.fast_uses_tiles and not (isinstance(w, QuantMatrix) and w.qtype in EIGHT_LANES_ONLY)
        if not self._fits(x, w, tiles or isinstance(w, GroupedMatrix)):  # the grouped kernel takes any rows
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
        lanes = " / ".join(sorted(t.name for t in EIGHT_LANES_ONLY))
        small_types = " / ".join(sorted(t.name for t in SMALL_STEP_TYPES))
        eight_bit = "8-bit x up to 64 rows, exact past them" if self.fast_wide_steps else "exact"
        if self.fast_lane_steps:
            lane_types = " / ".join(sorted(t.name for t in LANE_STEP_TYPES))
            eight_bit += f", {lane_types} from 8 rows with x in lanes, any rows"
        if self.fast_uses_tiles:
            tiled = " / ".join(sorted(t.name for t in TILED_SMALL_STEP_TYPES))
            below = f", {tiled} below 16 rows, Q8_0 up to 32: 8-bit x" if self.fast_wide_steps else ""
            tiles = f"bfloat16 products on AMX tiles ({lanes} weights: {eight_bit}{below})"
        elif self.fast_wide_steps:
            tiles = f"{small_types} weights {eight_bit}, other weights exact (no AMX tiles on {tier})"
        else:
            tiles = f"exact (no AMX tiles on {tier})"
        small = "8-bit x, integer dot products" if self.fast_small_steps else f"exact (no 8-bit path on {tier})"
        reach = " (Q8_0 up to 32 rows, the tiles past them)" if self.fast_uses_tiles else ", any rows"
        grouped = f"; Q5_0 / Q8_0 regrouped 16 rows at a time at load: 8-bit x{reach}" if self.groups_q8 else ""
        return (f"steps of 4 rows or more: {tiles}; steps of 1-3 rows on {small_types} weights: {small}; "
                f"steps of 1-3 rows on other weights: exact{grouped}")

    def small_steps_run(self) -> int:
        """How many projections of this process's library have run the 8-bit small steps (q8_dots.h), for the
        tests: a tier that should have the path proves it ran."""
        return int(self._small_steps_run())

    def dense(self, w: Matrix) -> np.ndarray:
        """w as float32: itself, or dequantized by the kernels' threads when the C kernel reads its type."""
        if not isinstance(w, QuantMatrix):
            return w
        if not readable(w) or isinstance(w, GroupedMatrix):  # the C dequantization reads rows as stored
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


Q = GGMLQuantizationType
WITH_MIN = (Q.Q4_1, Q.Q5_1)  # blocks that store m after d
FIVE_BITS = (Q.Q5_0, Q.Q5_1)  # blocks with 4 bytes of fifth bits, qh
Parts = tuple[np.ndarray, np.ndarray, np.ndarray]  # integers, scales per half block, offsets per half block


def small_step_parts(w: QuantMatrix) -> Parts:
    """The integers q (n, k / 32, 32) of a matrix of a type the small steps read, each half block's scale
    (n, k / 32, 2) and offset (n, k / 32, 2) such that each weight is scale * q + offset, from gguf's block
    layouts (quant_k.h's header): Q4_0 / Q4_1 4 bits, Q5_0 / Q5_1 5 (qh's bit j above weight j's nibble), offset
    -8 d, -16 d, or m; Q8_0 8 bits (signed), scale d, offset 0; Q4_K / Q5_K 4 or 5 bits, scale d * sc and offset
    -dmin * mn of each sub-block; Q6_K q - 32 (signed), scale d * scale of each 16 weights, offset 0; Q2_K 2 bits,
    scale d * sc and offset -dmin * mn of each 16 weights; Q3_K q - 4 (3 bits, signed), scale d * scale of each
    16 weights, offset 0."""
    if w.qtype in (Q.Q2_K, Q.Q3_K):
        return k23_parts(w)
    if w.qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return k_quant_parts(w)
    n, blocks = w.shape[0], w.shape[1] // 32
    raw = w.data.reshape(n, blocks, -1)
    d = half(raw, 0)
    if w.qtype == Q.Q8_0:  # d, then 32 signed bytes: offset 0
        return raw[..., 2:].view(np.int8).astype(np.int64), per_half(d), np.zeros((n, blocks, 2))
    start = 4 if w.qtype in WITH_MIN else 2
    if w.qtype in FIVE_BITS:
        qh = raw[..., start : start + 4].copy().view(np.uint32)[..., 0].astype(np.int64)
        high = (qh[..., None] >> np.arange(32)) & 1
        start += 4
    else:
        high = np.zeros((n, blocks, 32), np.int64)
    q = np.concatenate([raw[..., start:] & 0x0F, raw[..., start:] >> 4], axis=2).astype(np.int64) | high << 4
    offset = half(raw, 2) if w.qtype in WITH_MIN else (-16.0 if w.qtype in FIVE_BITS else -8.0) * d
    return q, per_half(d), per_half(offset)


def half(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block (or super-block), in float64."""
    return raw[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float64)


def k_quant_parts(w: QuantMatrix) -> Parts:
    """small_step_parts of a Q4_K / Q5_K / Q6_K matrix: each super-block's 8 sub-blocks as blocks of 32."""
    n, supers = w.shape[0], w.shape[1] // 256
    raw = w.data.reshape(n, supers, -1).astype(np.int64)
    s = np.arange(8)
    if w.qtype == Q.Q6_K:
        ql = raw[..., 64 * (s // 4)[:, None] + 32 * (s % 2)[:, None] + np.arange(32)]  # (n, supers, 8, 32)
        qh = raw[..., 128 + 32 * (s // 4)[:, None] + np.arange(32)]
        low = ql >> (4 * (s % 4 // 2))[:, None] & 0x0F
        q = (low | (qh >> (2 * (s % 4))[:, None] & 3) << 4) - 32
        scales = np.where(raw[..., 192:208] > 127, raw[..., 192:208] - 256, raw[..., 192:208])
        d = half(w.data.reshape(n, supers, -1), 208)[..., None] * scales
        return q.reshape(n, -1, 32), d.reshape(n, -1, 2), np.zeros((n, supers * 8, 2))
    packed = raw[..., 4:16]
    low6 = packed[..., :4] & 63, packed[..., 4:8] & 63
    high = (packed[..., 8:] & 0x0F | (packed[..., :4] >> 6) << 4, packed[..., 8:] >> 4 | (packed[..., 4:8] >> 6) << 4)
    sc, mn = (np.concatenate([lo, hi], axis=2) for lo, hi in zip(low6, high, strict=True))
    qs = raw[..., (48 if w.qtype == Q.Q5_K else 16) + 32 * (s // 2)[:, None] + np.arange(32)]
    q = qs >> (4 * (s % 2))[:, None] & 0x0F
    if w.qtype == Q.Q5_K:
        q |= (raw[..., None, 16:48] >> s[:, None] & 1) << 4
    stored = w.data.reshape(n, supers, -1)
    d, offset = half(stored, 0)[..., None] * sc, -half(stored, 2)[..., None] * mn
    return q.reshape(n, -1, 32), per_half(d.reshape(n, -1)), per_half(offset.reshape(n, -1))


def per_half(per_block: np.ndarray) -> np.ndarray:
    """A value per block (n, blocks) as the same value for both its halves (n, blocks, 2)."""
    return np.repeat(per_block[..., None], 2, axis=2)


def k23_parts(w: QuantMatrix) -> Parts:
    """small_step_parts of a Q2_K / Q3_K matrix: sub-block s of a super-block takes bits 2 (s % 4) of the 32
    bytes of its half s / 4 of qs (Q3_K: and bit s of hmask's 32 bytes above them); 16 scales a super-block."""
    n, supers = w.shape[0], w.shape[1] // 256
    raw = w.data.reshape(n, supers, -1).astype(np.int64)
    stored = w.data.reshape(n, supers, -1)
    s = np.arange(8)[:, None]
    low_at = 16 if w.qtype == Q.Q2_K else 32
    q = raw[..., low_at + 32 * (s // 4) + np.arange(32)] >> 2 * (s % 4) & 3  # (n, supers, 8, 32)
    if w.qtype == Q.Q2_K:
        scales = raw[..., :16]
        d, offset = half(stored, 80)[..., None] * (scales & 15), -half(stored, 82)[..., None] * (scales >> 4)
        return q.reshape(n, -1, 32), d.reshape(n, -1, 2), offset.reshape(n, -1, 2)
    q = (q | (raw[..., None, :32] >> s & 1) << 2) - 4
    g = np.arange(16)
    packed = raw[..., 96:108]
    scales = (packed[..., g % 8] >> 4 * (g // 8) & 15 | (packed[..., 8 + g % 4] >> 2 * (g // 4) & 3) << 4) - 32
    d = half(stored, 108)[..., None] * scales
    return q.reshape(n, -1, 32), d.reshape(n, -1, 2), np.zeros((n, supers * 8, 2))


def q8_terms(x: np.ndarray, w: QuantMatrix) -> tuple[np.ndarray, np.ndarray]:
    """Each block's two terms of the small-step product, in float64 (m, n, k / 32): the scales times dx times
    each half block's integer dot product (exact), summed over the halves, and the offsets times dx times each
    half's sum(qx), summed likewise; x rounded as q8_rows rounds it."""
    qx, dx = q8_rows(x)
    qw, dw, offset = small_step_parts(w)
    m, n, blocks = x.shape[0], w.shape[0], w.shape[1] // 32
    halves = qx.reshape(m, blocks, 2, 16)
    dots = np.einsum("mbhk,nbhk->mnbh", halves, qw.reshape(n, blocks, 2, 16))
    dx64 = dx.astype(np.float64)
    scaled = (dots.astype(np.float64) * dw[None]).sum(axis=3) * dx64[:, None]
    sums = dx64[..., None] * halves.sum(axis=3)  # (m, blocks, 2)
    return scaled, (offset[None] * sums[:, None]).sum(axis=3)


def q8_reference(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    """The fast precision's small-step product in NumPy, in float64: x rounded (q8_rows), each block's integer
    dot products exact, then scale * dx * dot + offset * dx * sum(qx) (the reference of q8_dots.h, q8_k.h)."""
    scaled, offsets = q8_terms(x, w)
    return scaled.sum(axis=2) + offsets.sum(axis=2)


def q8_bound(x: np.ndarray, w: QuantMatrix) -> np.ndarray:
    """Worst-case float32 error of q8_dots.h against q8_reference (first order in float32's unit roundoff U):
    the dots convert exactly (|dot| <= 32 * 128 * 127 < 2^24) and dx * sum(qx) and scale * dx round once (U of
    each term; Q2_K's and Q3_K's scales multiply the dots in integers), each FMA into its chain (one a block,
    Q6_K's two) rounds once (U of the chain so far, at most
    the sum of the terms' sizes), and the two chains' sum once: (FMAs + 2) U times the sum of |terms|, with 2 U
    to spare."""
    scaled, offsets = q8_terms(x, w)
    fmas = x.shape[1] // 32 * (2 if w.qtype == Q.Q6_K else 1)
    return (fmas + 4) * 2.0**-24 * (np.abs(scaled).sum(axis=2) + np.abs(offsets).sum(axis=2))
