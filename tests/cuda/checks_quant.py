"""Emulated dequantizing kernels (quant_gemv.cu, quant_gemm.cu, dequantize.cu) against the reference: gguf's own NumPy
dequantization (QuantMatrix.dequantize), then a float64 product (reference.linear).

Weights are random bytes rather than a quantizer's output, so every nibble, fifth or sixth bit, int8 value and
packed K-quant scale occurs, with scales and offsets of both signs and of every size down to float16
subnormals. Widths span several passes of a warp over the row's half blocks and a partial last pass, and are
not multiples of 256 where the type allows (the K-quants' rows are whole super-blocks of 256: an odd number of
them, so Q6_K's rows of 210-byte super-blocks start at 2-byte but not 4-byte offsets); the number of output
columns is not a multiple of the columns a block (8, the GEMM's 64) or a warp (2) owns, nor the GEMM's rows a
multiple of its 64-row tiles, and writes past the output are caught by a NaN canary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.cupy_backend import launch, reference
from backends.cupy_backend.gemm import choose_gemm
from backends.cupy_backend.projections import Projections
from backends.cupy_backend.quant_ops import QuantKernels
from backends.cupy_backend.quant_weights import DeviceQuant, upload_matrix
from backends.cupy_backend.storage import storage_for
from backends.cupy_backend.synthetic import random_blocks
from backends.model.quant import QuantMatrix
from tests.cuda.dtypes import FLOAT32, DType
from tests.cuda.emu_data import nan_like
from tests.cuda.emu_lib import EmuLib

# Output rounding: half an ulp of the storage dtype, relative (float32 results count as exact), and for float16
# half its subnormal spacing.
HALF_ULP = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}
HALF_ULP_ABS = {"float32": 0.0, "float16": 2.0**-25, "bfloat16": 0.0}
# float32 accumulation in any order: well within this fraction of sum |x * w| at these widths.
SUM_RTOL = 1e-5


@dataclass(frozen=True)
class Problem:
    """x in the storage dtype, W as stored, and what the reference needs of both."""

    x: npt.NDArray[np.generic]
    w: QuantMatrix
    x_values: npt.NDArray[np.float64]
    w_values: npt.NDArray[np.float32]  # gguf's dequantization

    @property
    def scale(self) -> npt.NDArray[np.float64]:
        """sum |x * w| of each output: what the summation error is relative to."""
        return np.abs(self.x_values) @ np.abs(self.w_values.astype(np.float64)).T


def make_problem(rng: np.random.Generator, dt: DType, qtype: str, rows: int, n: int, k: int) -> Problem:
    w = random_blocks(rng, qtype, n, k)
    x = dt.encode(rng.standard_normal((rows, k)))
    return Problem(x, w, dt.decode(x), w.dequantize())


def assert_product(got: npt.NDArray[np.float64], p: Problem, out_dtype: str, what: str,
                   weight_rounding: float = 0.0) -> None:
    """|got - x @ W.T| within the summation error, the output's rounding and, for products through a dense
    copy of W in a 16-bit dtype, that copy's rounding (relative to sum |x * w|)."""
    want = reference.linear(p.x_values, p.w_values)
    bound = (SUM_RTOL + weight_rounding) * p.scale + HALF_ULP[out_dtype] * np.abs(want) + HALF_ULP_ABS[out_dtype]
    err = np.abs(got - want)
    bad = ~(err <= bound)
    if bad.any():
        at = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.size} off, first at {at}: got {got[at]!r}, "
                             f"want {want[at]!r}, bound {bound[at]:.3g}")
    print(f"{what}: max err / bound {float((err / np.maximum(bound, 1e-30)).max()):.3g}")


def width(qtype: str, blocks_of_32: int) -> int:
    """A row width of `blocks_of_32` blocks, or for a K-quant that many super-blocks of 256."""
    return blocks_of_32 * launch.quant_row_multiple(qtype)


def check_dequantize(lib: EmuLib, dt: DType, qtype: str, seed: int = 0) -> None:
    """Rows picked by shuffled, repeated ids: gguf's float32 values, rounded once to the storage dtype."""
    rng = np.random.default_rng(seed)
    k = width(qtype, 5 if qtype in launch.K_QUANT_TYPES else 7)
    w = random_blocks(rng, qtype, 37, k)
    ids = rng.integers(0, 37, 23).astype(np.int32)
    out = nan_like(dt, (len(ids), k))
    lib.launch(launch.dequantize(qtype, dt.name, len(ids), k), [out, w.data, ids, k])
    want = dt.encode(w.dequantize()[ids])
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), f"dequantize {qtype} {dt.name}: bits differ"
    print(f"dequantize_{qtype} {dt.name}: {out.size} values bit-identical to gguf's")


def _launch_product(lib: EmuLib, p: Problem, spec: launch.Launch, dt: DType, logits: bool) -> npt.NDArray[np.float64]:
    """Runs the GEMV or GEMM `spec` into a NaN buffer with a NaN canary after the output; returns the output as
    float64."""
    (rows, k), n = p.x.shape, p.w.shape[0]
    out_dt = FLOAT32 if logits else dt
    buffer = nan_like(out_dt, (rows * n + 64,))
    out = buffer[: rows * n].reshape(rows, n)
    lib.launch(spec, [out, p.x, p.w.data, rows, n, k])
    assert np.isnan(out_dt.decode(buffer[rows * n :])).all(), f"{spec.name} wrote past its output"
    return out_dt.decode(out)


def check_quant_gemv(lib: EmuLib, dt: DType, qtype: str, n: int = 37, k: int = 0, seed: int = 0) -> None:
    """Every row count the GEMV takes, writing the storage dtype and float32 logits. k = 0: 33 blocks of 32
    (2 passes of a warp's lanes and 2 half blocks), or 5 super-blocks (80 half blocks: 2.5 passes)."""
    k = k or width(qtype, 5 if qtype in launch.K_QUANT_TYPES else 33)
    rng = np.random.default_rng(seed)
    for rows in range(1, launch.QUANT_GEMV_MAX_ROWS + 1):
        p = make_problem(rng, dt, qtype, rows, n, k)
        for logits in (False, True):
            spec = launch.quant_gemv(qtype, dt.name, rows, n, k, logits)
            got = _launch_product(lib, p, spec, dt, logits)
            out_dtype = "float32" if logits else dt.name
            assert_product(got, p, out_dtype, f"quant_gemv {qtype} {dt.name} rows {rows} -> {out_dtype}")


def check_quant_gemm(lib: EmuLib, dt: DType, qtype: str, n: int = 77, k: int = 0, seed: int = 0,
                     row_counts: tuple[int, ...] = (9, 64, 70)) -> None:
    """Past the GEMV's rows, one tile of rows, and a second tile's few: the storage dtype and float32 logits,
    against the product with W rounded to the storage dtype, as a dense copy holds it. k = 0: 7 blocks of 32,
    or 1 super-block (7 or 8 steps of the double buffer)."""
    k = k or width(qtype, 1 if qtype in launch.K_QUANT_TYPES else 7)
    rng = np.random.default_rng(seed)
    for rows in row_counts:
        p = make_problem(rng, dt, qtype, rows, n, k)
        copied = replace(p, w_values=dt.decode(dt.encode(p.w_values)).astype(np.float32))  # the copy's values
        for logits in (False, True):
            got = _launch_product(lib, p, launch.quant_gemm(qtype, dt.name, rows, n, k, logits), dt, logits)
            out_dtype = "float32" if logits else dt.name
            assert_product(got, copied, out_dtype, f"quant_gemm {qtype} {dt.name} rows {rows} -> {out_dtype}")


class _Recorder:
    """The emulation library as a KernelLauncher that remembers which kernels ran."""

    def __init__(self, lib: EmuLib) -> None:
        self.lib = lib
        self.names: list[str] = []

    def launch(self, spec: launch.Launch, args: Any) -> None:
        self.names.append(spec.name)
        self.lib.launch(spec, args)

    def call(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


def check_projections(lib: EmuLib, dt: DType, qtype: str, n: int = 45, k: int = 0, seed: int = 0) -> None:
    """The matrix as quant_weights uploads it: Projections.linear / logits for 1 row up to past the GEMV limit
    (the dequantizing GEMM, never a dense copy), and the embedding lookup, against the reference. k = 0: 3
    blocks, or 1 super-block."""
    k = k or width(qtype, 1 if qtype in launch.K_QUANT_TYPES else 3)
    rng = np.random.default_rng(seed)
    storage, recorder = storage_for(dt.name), _Recorder(lib)
    proj = Projections(choose_gemm(np, storage), QuantKernels(np, recorder, storage))
    for rows in (*range(1, launch.QUANT_GEMV_MAX_ROWS + 1), launch.QUANT_GEMV_MAX_ROWS + 1, 20):
        p = make_problem(rng, dt, qtype, rows, n, k)
        w = upload_matrix(np, storage, p.w)
        assert isinstance(w, DeviceQuant) and w.qtype == qtype and w.data is p.w.data, "uploaded as stored"
        gemv = rows <= launch.QUANT_GEMV_MAX_ROWS
        copy_rounding = 0.0 if gemv else HALF_ULP[dt.name] * 2
        recorder.names.clear()
        assert_product(dt.decode(proj.linear(p.x, w)), p, dt.name, f"linear {rows} rows", copy_rounding)
        assert_product(np.asarray(proj.logits(p.x, w), np.float64), p, "float32", f"logits {rows} rows",
                       copy_rounding)
        assert recorder.names and all(name.startswith("quant_gemv" if gemv else "quant_gemm")
                                      for name in recorder.names), recorder.names
    ids = rng.integers(0, n, 11).astype(np.int32)
    looked_up = proj.embed(w, ids)
    assert np.array_equal(looked_up.view(np.uint8), dt.encode(p.w_values[ids]).view(np.uint8)), "embedding rows"


def check_quant(lib: EmuLib, dt: DType, qtype: str) -> None:
    check_dequantize(lib, dt, qtype)
    check_quant_gemv(lib, dt, qtype)
    check_quant_gemm(lib, dt, qtype)
    check_projections(lib, dt, qtype)
