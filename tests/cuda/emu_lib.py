"""ctypes access to the emulation library: launch a kernel on host arrays the way CuPy launches it on the GPU
(name, grid, block, shared memory, argument list), with arguments packed per launch.py's type string."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from backends.cupy_backend.launch import Launch

Arg = npt.NDArray[np.generic] | int | float
U32x3 = ctypes.c_uint32 * 3


def _pack(code: str, value: Arg) -> ctypes._SimpleCData:
    if code == "p":
        if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
            raise TypeError("pointer arguments must be C-contiguous numpy arrays")
        return ctypes.c_void_p(value.ctypes.data)
    if isinstance(value, np.ndarray):
        raise TypeError(f"scalar argument expected for type {code!r}")
    if code == "i":
        return ctypes.c_int32(int(value))
    if code == "q":
        return ctypes.c_int64(int(value))
    if code == "f":
        return ctypes.c_float(float(value))
    raise ValueError(f"unknown argument type {code!r}")


class EmuLib:
    def __init__(self, path: str) -> None:
        self._lib = ctypes.CDLL(path)
        self._lib.emu_launch.restype = ctypes.c_int
        self._lib.emu_launch.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_ulonglong,
            ctypes.POINTER(ctypes.c_void_p),
        ]

    def launch(self, spec: Launch, args: Sequence[Arg]) -> None:
        if len(args) != len(spec.arg_types):
            raise TypeError(f"{spec.name} takes {len(spec.arg_types)} arguments, got {len(args)}")
        packed = [_pack(code, value) for code, value in zip(spec.arg_types, args, strict=True)]
        pointers = (ctypes.c_void_p * len(packed))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in packed])
        rc = self._lib.emu_launch(
            spec.name.encode(),
            spec.arg_types.encode(),
            U32x3(*spec.grid),
            U32x3(*spec.block),
            spec.shared_mem,
            pointers,
        )
        if rc != 0:
            raise RuntimeError(f"emu_launch({spec.name}) failed with code {rc}")

    def convert(self, kind: str, values: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        """Runs one of the emulated dtype conversions (f32_to_f16, f16_to_f32, f32_to_bf16, bf16_to_f32)."""
        out_dtype = np.float32 if kind.endswith("f32") else np.uint16
        src = np.ascontiguousarray(values)
        out = np.empty(src.shape, dtype=out_dtype)
        fn = getattr(self._lib, f"emu_{kind}")
        fn(ctypes.c_void_p(src.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_longlong(src.size))
        return out
