"""How the C kernels receive a weight matrix: its address, the bytes of one row, and its type (quant.h's
Weights), whether float32 or as the GGUF file stores it."""

from __future__ import annotations

import ctypes

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.quant import Matrix, QuantMatrix
from backends.numpy_backend.native.arrays import is_c_array

# What the kernels read as stored (quant.h): the types kept as stored when the backend loads with gguf weights.
STORED_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0,
                          GGMLQuantizationType.F16, GGMLQuantizationType.BF16})
QBLOCK, LANES = 32, 8  # quant.h: weights per block of the quantized types; floats per vector


class CWeights(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("row_bytes", ctypes.c_int64), ("type", ctypes.c_int32)]


def readable(matrix: Matrix) -> bool:
    """Whether the kernels read `matrix` as it is (quant.h's weights_supported, and a usable float32 array)."""
    if isinstance(matrix, QuantMatrix):
        cols = matrix.shape[1]
        quantized = matrix.qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
                                     GGMLQuantizationType.Q8_0)
        return matrix.qtype in STORED_TYPES and cols % (QBLOCK if quantized else LANES) == 0
    return matrix.ndim == 2 and matrix.shape[1] % LANES == 0 and is_c_array(matrix, np.float32)


def c_weights(matrix: Matrix) -> CWeights:
    """The descriptor of a readable matrix; the caller keeps `matrix` alive while C uses it."""
    if isinstance(matrix, QuantMatrix):
        return CWeights(matrix.data.ctypes.data, matrix.row_bytes, int(matrix.qtype))
    return CWeights(matrix.ctypes.data, matrix.shape[1] * 4, int(GGMLQuantizationType.F32))
