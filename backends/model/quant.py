"""Weight matrices kept as the GGUF file stores them: rows of quantized blocks (or 16-bit floats), handed to the
kernels as they are and dequantized only where a value is used.

Decoding reads every weight once per step, so the bytes a step reads are its cost: the default model is 97 MB
stored and 538 MB as float32. The NumPy dequantization of the `gguf` package is the reference for every kernel
that reads these blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

F32 = np.float32


@dataclass(frozen=True)
class QuantMatrix:
    """An (out, in) weight matrix as stored: `data` holds each row's bytes, C-contiguous uint8 (out, row_bytes)."""

    qtype: GGMLQuantizationType
    shape: tuple[int, int]
    data: np.ndarray

    def __post_init__(self) -> None:
        rows, cols = self.shape
        block, block_bytes = GGML_QUANT_SIZES[self.qtype]
        if cols % block or self.data.dtype != np.uint8 or self.data.shape != (rows, cols // block * block_bytes):
            raise ValueError(f"{self.qtype.name} matrix {self.shape}: data {self.data.dtype} {self.data.shape}")

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def row_bytes(self) -> int:
        return int(self.data.shape[1])

    def dequantize(self) -> np.ndarray:
        """The whole matrix as float32 (the reference; never kept by the kernels' paths)."""
        return dequantize_rows(self.qtype, self.data, self.shape[1])

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` as float32 (T, in): an embedding lookup reads only the rows it needs."""
        return dequantize_rows(self.qtype, self.data[ids], self.shape[1])

    @classmethod
    def of(cls, raw: np.ndarray, qtype: GGMLQuantizationType, cols: int) -> QuantMatrix:
        """A copy of a tensor's stored bytes (rows, row_bytes), out of the file's memory map."""
        data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(raw.shape[0], -1).copy()
        return cls(qtype, (data.shape[0], cols), data)

    @classmethod
    def quantize(cls, array: np.ndarray, qtype: GGMLQuantizationType) -> QuantMatrix:
        """`array` (out, in) stored as `qtype` (tests, synthetic models)."""
        stored = np.ascontiguousarray(quants.quantize(np.asarray(array, F32), qtype))
        return cls(qtype, (array.shape[0], array.shape[1]), stored.view(np.uint8).reshape(array.shape[0], -1))

    @classmethod
    def stack(cls, parts: Sequence[QuantMatrix]) -> QuantMatrix:
        """The parts' rows one after another (Q, K and V as one matrix); same type and width required."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.shape[1] != first.shape[1] for p in parts):
            raise ValueError("stacked matrices must share their type and width")
        data = np.concatenate([p.data for p in parts])
        return cls(first.qtype, (data.shape[0], first.shape[1]), data)


Matrix = np.ndarray | QuantMatrix  # a weight as a kernel receives it: float32, or as stored

Q = GGMLQuantizationType
# Blocks of 32 weights d * (q - offset), one float16 d a block, |q - offset| <= 16: Q8_0's blocks (d, then 32 int8)
# hold the same d and the same integers, so gguf (and the kernels) give every weight the same float32 product.
_OFFSET_BLOCKS = {Q.Q4_0: 8, Q.Q5_0: 16}


def as_q8_0(matrix: QuantMatrix) -> QuantMatrix | None:
    """The matrix in Q8_0 with every dequantized value unchanged (Q4_0, Q5_0: 1.55-2.1x their bytes, a quarter of a
    float32 copy's), so that Q, K and V of mixed types stack as stored; None for a type that cannot be."""
    if matrix.qtype == Q.Q8_0:
        return matrix
    offset = _OFFSET_BLOCKS.get(matrix.qtype)
    if offset is None:
        return None
    rows, cols = matrix.shape
    blocks = matrix.data.reshape(rows, cols // 32, -1)
    nibbles = blocks[..., -16:]  # byte j: weight j in its low nibble, weight j + 16 in its high one
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    if matrix.qtype == Q.Q5_0:  # qh (4 bytes after d, little-endian): bit j is weight j's fifth bit
        qh = blocks[..., 2:6].copy().view("<u4")
        q |= ((qh >> np.arange(32, dtype=np.uint32) & 1) << 4).astype(np.uint8)
    ints = (q.astype(np.int16) - offset).astype(np.int8)
    data = np.concatenate([blocks[..., :2], ints.view(np.uint8)], axis=-1).reshape(rows, -1)
    return QuantMatrix(Q.Q8_0, matrix.shape, np.ascontiguousarray(data))


def dequantize_rows(qtype: GGMLQuantizationType, data: np.ndarray, cols: int) -> np.ndarray:
    out = quants.dequantize(np.ascontiguousarray(data), qtype)
    return np.ascontiguousarray(out.reshape(len(data), cols), dtype=F32)


def dense(matrix: Matrix) -> np.ndarray:
    """float32 values of a weight, however it is kept."""
    return matrix.dequantize() if isinstance(matrix, QuantMatrix) else matrix


def lookup(matrix: Matrix, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of a weight as float32: the embedding lookup."""
    return matrix.rows(ids) if isinstance(matrix, QuantMatrix) else matrix[ids]


def matrix_bytes(matrix: Matrix) -> int:
    return matrix.nbytes if isinstance(matrix, QuantMatrix) else int(matrix.nbytes)
