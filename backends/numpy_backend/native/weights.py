"""How the C kernels receive a weight matrix: its address, the bytes of one row, and its type (quant.h's
Weights), whether float32 or as the GGUF file stores it."""

from __future__ import annotations

import ctypes

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.quant import Matrix, QuantMatrix
from backends.numpy_backend.native.arrays import is_c_array
from backends.numpy_backend.native.grouped_q8 import GroupedMatrix

Q = GGMLQuantizationType
# What the kernels read as stored (quant.h, quant_k.h): the types kept as stored when the backend loads with gguf
# weights.
STORED_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16,
                          Q.BF16})
# Read by the 8-lane kernels alone, on every tier (quant_k.h): never on AMX tiles, so exact in the fast precision's
# steps of 4 rows and more
EIGHT_LANES_ONLY = frozenset({Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K})
# The fast precision's steps of 1-3 rows multiply 8-bit x by these types' integers (q8_dots.h, q8_k.h, q8_k23.h)
SMALL_STEP_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K})
# Of those, the ones the AMX tiles read too (the others are EIGHT_LANES_ONLY): the tiles from FAST_TILE rows
TILED_SMALL_STEP_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q8_0})
# Of those, the ones steps of 8 rows and more multiply with x in vector lanes on AVX-512 VNNI (q8_lanes.h), past 64
LANE_STEP_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K})
QBLOCK, QK_K, LANES = 32, 256, 8  # quant.h: weights per block, per K-quant super-block; floats per vector
# quant.h's weights_supported: a row's length is a multiple of this
ROW_MULTIPLE = {Q.Q4_0: QBLOCK, Q.Q4_1: QBLOCK, Q.Q8_0: QBLOCK, Q.Q5_0: QBLOCK, Q.Q5_1: QBLOCK, Q.Q2_K: QK_K,
                Q.Q3_K: QK_K, Q.Q4_K: QK_K, Q.Q5_K: QK_K, Q.Q6_K: QK_K, Q.F16: LANES, Q.BF16: LANES}


class CWeights(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("row_bytes", ctypes.c_int64), ("type", ctypes.c_int32)]


def readable(matrix: Matrix) -> bool:
    """Whether the kernels read `matrix` as it is (quant.h's weights_supported, and a usable float32 array)."""
    if isinstance(matrix, QuantMatrix):
        return matrix.qtype in STORED_TYPES and matrix.shape[1] % ROW_MULTIPLE[matrix.qtype] == 0
    return matrix.ndim == 2 and matrix.shape[1] % LANES == 0 and is_c_array(matrix, np.float32)


def c_weights(matrix: Matrix) -> CWeights:
    """The descriptor of a readable matrix; the caller keeps `matrix` alive while C uses it."""
    if isinstance(matrix, QuantMatrix):
        kind = matrix.c_type if isinstance(matrix, GroupedMatrix) else int(matrix.qtype)
        return CWeights(matrix.data.ctypes.data, matrix.row_bytes, kind)
    return CWeights(matrix.ctypes.data, matrix.shape[1] * 4, int(Q.F32))
