"""Q8_0 matrices regrouped 16 rows at a time for the fast precision's kernel on AVX-512 VNNI (q8_grouped.h).

As a file stores it, a Q8_0 row is its blocks one after another, and the kernel multiplying 16 rows at once
first transposes them in registers. Regrouped once at load, a group's block is its 16 rows' scales and then
their weights 4 bytes per row per vector, each + 128, in the order the kernel consumes them: Gemma 3's output
head (178 MB) is read at the bus's speed instead of 74 % of it. The regrouped matrix takes the bytes the stored
one took (the stored copy is freed), and only that kernel reads it: the exact precision's kernels, and tiers
without it, keep rows as stored. The values are Q8_0's: `rows` and `dequantize` give what gguf gives for the
stored matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.loader import return_freed_memory
from backends.model.quant import Matrix, QuantMatrix, dequantize_rows
from backends.model.weights import LayerWeights, ModelWeights

Q8_0 = GGMLQuantizationType.Q8_0
GROUP_ROWS = 16  # rows a group (q8_grouped.h's GROUPED_ROWS)
C_TYPE = 1008  # quant.h's WEIGHTS_Q8_0_G16
_BLOCK, _SCALES = 34, 2  # a Q8_0 block's bytes, and its float16 d's
_CHUNK_ROWS = 4096  # rows regrouped at a time: the temporaries stay a few MB


@dataclass(frozen=True)
class GroupedQ8(QuantMatrix):
    """A Q8_0 matrix whose `data` holds the regrouped bytes (same shape and size as the stored rows); only the
    grouped kernel reads `data`, everything else goes through `rows` and `dequantize`."""

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return dequantize_rows(Q8_0, stored_rows(self.data, np.asarray(ids, np.int64), self.shape[1]), self.shape[1])

    def dequantize(self) -> np.ndarray:
        return self.rows(np.arange(self.shape[0]))


def groupable(matrix: Matrix) -> bool:
    """A Q8_0 matrix as stored whose rows fill whole groups."""
    return type(matrix) is QuantMatrix and matrix.qtype == Q8_0 and matrix.shape[0] % GROUP_ROWS == 0


def group(matrix: QuantMatrix) -> GroupedQ8:
    """The matrix regrouped (a new array, filled a chunk of rows at a time)."""
    out = np.empty_like(matrix.data)
    for first in range(0, matrix.shape[0], _CHUNK_ROWS):
        rows = matrix.data[first:first + _CHUNK_ROWS]
        out[first:first + len(rows)] = _grouped(rows, matrix.shape[1] // 32)
    return GroupedQ8(Q8_0, matrix.shape, out)


def _grouped(rows: np.ndarray, blocks: int) -> np.ndarray:
    """Whole groups of stored rows, regrouped: per group and block the 16 d's, then word c of row j at 64 c + 4 j."""
    groups = len(rows) // GROUP_ROWS
    stored = rows.reshape(groups, GROUP_ROWS, blocks, _BLOCK).transpose(0, 2, 1, 3)  # (group, block, row, byte)
    scales = stored[..., :_SCALES].reshape(groups, blocks, -1)
    words = (stored[..., _SCALES:] ^ 0x80).reshape(groups, blocks, GROUP_ROWS, 8, 4).transpose(0, 1, 3, 2, 4)
    return np.concatenate([scales, words.reshape(groups, blocks, -1)], axis=-1).reshape(len(rows), -1)


def stored_rows(data: np.ndarray, ids: np.ndarray, cols: int) -> np.ndarray:
    """Rows `ids` of a regrouped matrix as the file stores them (ids, cols / 32 * 34)."""
    blocks = cols // 32
    grouped = data.reshape(-1, blocks, GROUP_ROWS * _BLOCK)
    group_of, lane = ids // GROUP_ROWS, ids % GROUP_ROWS
    scale_at = _SCALES * lane[:, None] + np.arange(_SCALES)  # (ids, 2)
    word_at = GROUP_ROWS * _SCALES + 64 * np.arange(8)[:, None] + 4 * lane[:, None, None] + np.arange(4)
    at = np.concatenate([scale_at, word_at.reshape(len(ids), -1)], axis=-1)  # (ids, 34): a row's block bytes
    picked = grouped[group_of[:, None, None], np.arange(blocks)[None, :, None], at[:, None, :]]
    picked[..., _SCALES:] ^= 0x80
    return picked.reshape(len(ids), -1)


def group_weights(weights: ModelWeights) -> ModelWeights:
    """The weights with every groupable matrix regrouped (a tied head and embedding stay one matrix)."""
    done: dict[int, Matrix] = {}

    def regrouped(matrix: Matrix) -> Matrix:
        if id(matrix) not in done:
            done[id(matrix)] = group(matrix) if isinstance(matrix, QuantMatrix) and groupable(matrix) else matrix
        return done[id(matrix)]

    layers = tuple(_layer(layer, regrouped) for layer in weights.layers)
    grouped = dataclasses.replace(weights, embedding=regrouped(weights.embedding), layers=layers,
                                  lm_head=regrouped(weights.lm_head))
    return_freed_memory()  # the chunks' temporaries: glibc would keep their heap (9 MiB of Gemma 3's)
    return grouped


def _layer(layer: LayerWeights, regrouped: Callable[[Matrix], Matrix]) -> LayerWeights:
    return dataclasses.replace(layer, wqkv=regrouped(layer.wqkv), wo=regrouped(layer.wo),
                               w_gate_up=regrouped(layer.w_gate_up), w_down=regrouped(layer.w_down))
