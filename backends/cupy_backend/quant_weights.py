"""Weight matrices on the device as the GGUF file stores them, for the dequantizing kernels
(kernels/quant_blocks.cuh, quant_gemv.cu, dequantize.cu).

With `backend.weights = gguf` the loader hands over every matrix of a type in STORED_TYPES as stored (a
QuantMatrix). Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K go to the device as
their bytes, unchanged: one uint8 array per matrix, plus its type and shape on the host. F16 and BF16 are kept as
stored by the loader too (no float32 copy of the whole model on the host) but go to the device dense in the
storage dtype, where cuBLAS reads them; that is exact when the storage dtype is the file's. Every other matrix
(IQ4_NL, MXFP4, ...: no kernel reads them) arrives as float32, dequantized by the loader and named once at start-up
(create), and is stored dense likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.cupy_backend.launch import QUANT_TYPES
from backends.cupy_backend.storage import Storage

if TYPE_CHECKING:  # the loader's module imports gguf; importing this one must stay light
    from gguf import GGMLQuantizationType

    from backends.model.quant import Matrix

# Those uploaded as stored, gguf type name -> launch.QUANT_TYPES name
KERNEL_TYPES = {name.upper(): name for name in QUANT_TYPES}
STORED_TYPES = (*KERNEL_TYPES, "F16", "BF16")  # gguf type names the loader keeps as stored


@dataclass(frozen=True)
class DeviceQuant:
    """An (out, in) weight matrix as stored: `data` holds each row's blocks, a (out, row_bytes) uint8 array."""

    qtype: str  # a launch.QUANT_TYPES name
    data: Any
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def stored_types() -> frozenset[GGMLQuantizationType]:
    """What `load_model(stored=...)` should keep as stored for this backend."""
    from gguf import GGMLQuantizationType  # noqa: PLC0415 - only when a model is loaded

    return frozenset(GGMLQuantizationType[name] for name in STORED_TYPES)


def upload_matrix(xp: Any, storage: Storage, matrix: Matrix) -> Any:
    """A DeviceQuant of the stored bytes when the kernels read the matrix's type, else a dense device array
    in the storage dtype (each value rounded once from its float32 value)."""
    from backends.model.quant import QuantMatrix, dense  # noqa: PLC0415 - imports gguf, as the loader did

    if isinstance(matrix, QuantMatrix) and matrix.qtype.name in KERNEL_TYPES:
        return DeviceQuant(KERNEL_TYPES[matrix.qtype.name], xp.asarray(matrix.data), matrix.shape)
    return xp.asarray(storage.encode(np, np.ascontiguousarray(dense(matrix), dtype=np.float32)))
