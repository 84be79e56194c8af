"""The backend's matrix products: y = x @ w.T with w stored (out, in), as the GGUF weights are.

float32 and float16 go through `xp.matmul` (cuBLAS on the GPU). bfloat16 is stored as uint16 bits
(storage.py), so it needs one of: `CublasBf16Gemm` (cublasGemmEx on the bits, float32 accumulation; the GPU
path) or `UpcastBf16Gemm` (widen to float32, multiply, round back; exact to the same rounding, used on the
CPU and as the GPU fallback). `choose_gemm` picks one and checks a GPU candidate against the upcast result
before trusting it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from backends.cupy_backend.storage import Storage, bf16_decode, bf16_encode

# cuBLAS / CUDA runtime enum values (cublas_api.h, library_types.h); ABI-stable across CUDA releases.
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUDA_R_32F, CUDA_R_16BF = 0, 14

log = logging.getLogger(__name__)


class Gemm(Protocol):
    name: str

    def linear(self, x: Any, w: Any) -> Any:
        """(M, K) x (N, K) weights -> (M, N), in the storage dtype."""
        ...

    def logits(self, x: Any, w: Any) -> Any:
        """(M, K) x (N, K) weights -> (M, N) float32, for sampling."""
        ...


class MatmulGemm:
    """xp.matmul on a native dtype (float32 / float16)."""

    name = "matmul"

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def linear(self, x: Any, w: Any) -> Any:
        return self.xp.matmul(x, w.T)

    def logits(self, x: Any, w: Any) -> Any:
        return self.xp.matmul(x, w.T).astype(self.xp.float32, copy=False)


class UpcastBf16Gemm:
    """bfloat16 bits widened to float32 for the product: what a bf16 GEMM with float32 accumulation computes,
    up to summation order. Widens the weight on every call: correct everywhere, fast nowhere on a GPU."""

    name = "bf16-upcast"

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def logits(self, x: Any, w: Any) -> Any:
        return self.xp.matmul(bf16_decode(self.xp, x), bf16_decode(self.xp, w).T)

    def linear(self, x: Any, w: Any) -> Any:
        return bf16_encode(self.xp, self.logits(x, w))


class CublasBf16Gemm:
    """cublasGemmEx on uint16 bit arrays typed as CUDA_R_16BF, float32 compute. Row-major y = x @ w.T is the
    column-major product y^T = w x^T: op(A) = w (A is w's buffer read transposed), B = x's buffer."""

    name = "bf16-cublas"

    def __init__(self, cupy: Any, cublas: Any = None) -> None:
        if cublas is None:  # tests pass a stand-in
            from cupy_backends.cuda.libs import cublas as cupy_cublas  # noqa: PLC0415 - GPU only

            cublas = cupy_cublas
        self.cupy, self.cublas = cupy, cublas
        # Host scalars for alpha / beta; kept alive for the handle's lifetime of use.
        self._one, self._zero = np.ones(1, np.float32), np.zeros(1, np.float32)

    def linear(self, x: Any, w: Any) -> Any:
        return self._gemm(x, w, self.cupy.uint16, CUDA_R_16BF)

    def logits(self, x: Any, w: Any) -> Any:
        return self._gemm(x, w, self.cupy.float32, CUDA_R_32F)

    def _gemm(self, x: Any, w: Any, out_dtype: Any, out_type: int) -> Any:
        x, w = self.cupy.ascontiguousarray(x), self.cupy.ascontiguousarray(w)
        (m, k), n = x.shape, w.shape[0]
        if w.shape[1] != k:
            raise ValueError(f"gemm shapes {x.shape} x {w.shape}^T do not match")
        y = self.cupy.empty((m, n), dtype=out_dtype)
        if m == 0 or n == 0:
            return y
        handle = self.cupy.cuda.device.get_cublas_handle()
        mode = self.cublas.getPointerMode(handle)
        self.cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
        try:
            self.cublas.gemmEx(
                handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k,
                self._one.ctypes.data, w.data.ptr, CUDA_R_16BF, k,
                x.data.ptr, CUDA_R_16BF, k,
                self._zero.ctypes.data, y.data.ptr, out_type, n,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip
        finally:
            self.cublas.setPointerMode(handle, mode)
        return y


def choose_gemm(xp: Any, storage: Storage) -> Gemm:
    """The GEMM for this array module and dtype; on a GPU, bf16 via cuBLAS when it agrees with the upcast."""
    if not storage.is_bf16:
        return MatmulGemm(xp)
    if xp.__name__ == "numpy":
        return UpcastBf16Gemm(xp)
    try:
        candidate = CublasBf16Gemm(xp)
        if agrees(xp, candidate, UpcastBf16Gemm(xp)):
            return candidate
        reason = "its results differ from the float32 product"
    except Exception as exc:  # noqa: BLE001 - any failure of the fast path leaves the exact one
        reason = f"{type(exc).__name__}: {exc}"
    log.warning("bfloat16 GEMMs through cuBLAS are unavailable (%s); widening to float32 instead (slow)", reason)
    return UpcastBf16Gemm(xp)


def agrees(xp: Any, candidate: Gemm, reference: Gemm, rows: int = 8, inner: int = 96, cols: int = 40) -> bool:
    """Both GEMMs on small random bf16 operands: logits within float32 summation error, linear within one
    bf16 rounding step."""
    rng = np.random.default_rng(0)
    x = xp.asarray(bf16_encode(np, rng.standard_normal((rows, inner)).astype(np.float32)))
    w = xp.asarray(bf16_encode(np, rng.standard_normal((cols, inner)).astype(np.float32)))
    got, want = candidate.logits(x, w), reference.logits(x, w)
    if got.dtype != xp.float32 or not bool(xp.allclose(got, want, rtol=1e-4, atol=1e-3)):
        return False
    lin, ref = bf16_decode(xp, candidate.linear(x, w)), bf16_decode(xp, reference.linear(x, w))
    return bool(xp.allclose(lin, ref, rtol=1e-2, atol=1e-2))
