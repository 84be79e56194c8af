"""Stand-ins for the CuPy pieces the backend touches, built on NumPy host memory, so the GPU-only glue
(argument conversion, module compilation fallback, the cuBLAS call's column-major mapping) runs here."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np

from backends.cupy_backend.gemm import CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF, CUDA_R_32F
from backends.cupy_backend.storage import bf16_decode, bf16_encode


class DeviceArray(np.ndarray):
    """A host array that answers `.data.ptr` like a CuPy array."""

    @property
    def data(self) -> Any:
        return SimpleNamespace(ptr=self.ctypes.data)


def device(a: Any) -> DeviceArray:
    return np.ascontiguousarray(a).view(DeviceArray)


def fake_cupy(**extra: Any) -> SimpleNamespace:
    """The attributes of `cupy` that the launcher and the cuBLAS GEMM use."""
    return SimpleNamespace(
        __name__="cupy",
        ndarray=DeviceArray,
        uint16=np.uint16,
        float32=np.float32,
        ascontiguousarray=device,
        empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
        cuda=SimpleNamespace(device=SimpleNamespace(get_cublas_handle=lambda: 7)),
        **extra,
    )


class FakeCublas:
    """cublasGemmEx semantics on host pointers: column-major operands, op() by the trans flags."""

    def __init__(self) -> None:
        self.pointer_mode = 1  # device mode, so the GEMM must switch to host mode and back
        self.modes_seen: list[int] = []

    def getPointerMode(self, handle: int) -> int:
        return self.pointer_mode

    def setPointerMode(self, handle: int, mode: int) -> None:
        self.pointer_mode = mode
        self.modes_seen.append(mode)

    def gemmEx(self, handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int,
               a_type: int, lda: int, b: int, b_type: int, ldb: int, beta: int, c: int, c_type: int, ldc: int,
               compute: int, algo: int) -> None:
        assert self.pointer_mode == 0, "alpha/beta are host pointers"
        op_a = _operand(a, a_type, lda, transa, m, k)
        op_b = _operand(b, b_type, ldb, transb, k, n)
        scale = ctypes.c_float.from_address(alpha).value
        assert ctypes.c_float.from_address(beta).value == 0.0
        result = scale * (op_a @ op_b)  # (m, n)
        out = _view(c, c_type, ldc, n)  # (ldc, n) column-major
        out[:m, :n] = bf16_encode(np, result) if c_type == CUDA_R_16BF else result


def _view(ptr: int, dtype_code: int, ld: int, cols: int) -> np.ndarray:
    """The column-major (ld, cols) matrix at ptr, as a writable view."""
    ctype = ctypes.c_uint16 if dtype_code == CUDA_R_16BF else ctypes.c_float
    assert dtype_code in (CUDA_R_16BF, CUDA_R_32F)
    flat = np.ctypeslib.as_array((ctype * (ld * cols)).from_address(ptr))
    return flat.reshape(cols, ld).T


def _operand(ptr: int, dtype_code: int, ld: int, trans: int, rows: int, cols: int) -> np.ndarray:
    """op(X) as a (rows, cols) float array: X stored (rows, cols) for N, (cols, rows) for T."""
    stored = _view(ptr, dtype_code, ld, cols if trans == CUBLAS_OP_N else rows)
    values = bf16_decode(np, np.ascontiguousarray(stored)) if dtype_code == CUDA_R_16BF else stored
    assert trans in (CUBLAS_OP_N, CUBLAS_OP_T)
    return values[:rows, :cols] if trans == CUBLAS_OP_N else values[:cols, :rows].T
