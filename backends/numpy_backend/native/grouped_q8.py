"""Q8_0 and Q5_0 matrices regrouped 16 rows at a time for the fast precision's kernel on AVX-512 VNNI
(q8_grouped.h).

As a file stores it, a row is its blocks one after another, and the kernel multiplying 16 rows at once first
transposes them in registers. Regrouped once at load, a group's block is its 16 rows' scales (and Q5_0's fifth
bits), then their weights 4 bytes per row per vector, in the order the kernel consumes them (Q8_0's + 128): Gemma
3's output head (178 MB) is read at the bus's speed instead of 74 % of it. The regrouped matrix takes the bytes
the stored one took (the stored copy is freed), and only that kernel reads it: the exact precision's kernels, and
tiers without it, keep rows as stored. The values are the type's: `rows` and `dequantize` give what gguf gives for
the stored matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from gguf import GGMLQuantizationType

from backends.model.loader import return_freed_memory
from backends.model.quant import Matrix, QuantMatrix, dequantize_rows
from backends.model.weights import LayerWeights, ModelWeights

Q = GGMLQuantizationType
GROUP_ROWS = 16  # rows a group (q8_grouped.h's GROUPED_ROWS)
_CHUNK_ROWS = 4096  # rows regrouped at a time: the temporaries stay a few MB


@dataclass(frozen=True)
class Layout:
    """A block as stored: `header` fields (their bytes, in order) and then `words` 4-byte words of weights."""

    header: tuple[int, ...]
    words: int
    flip: int  # XORed into every weight byte (Q8_0's + 128: unsigned for vpdpbusd)
    c_type: int  # quant.h's id of the regrouped type

    @property
    def block_bytes(self) -> int:
        return sum(self.header) + 4 * self.words

    @cached_property
    def places(self) -> np.ndarray:
        """(GROUP_ROWS, block_bytes): where byte b of row j's stored block lies in the group's block. A header
        field's bytes of row j at 16 x (the fields before) + size x j; word c of row j at 64 c + 4 j after them."""
        lane, parts, at = np.arange(GROUP_ROWS)[:, None], [], 0
        for size in self.header:
            parts.append(GROUP_ROWS * at + size * lane + np.arange(size))
            at += size
        words = GROUP_ROWS * at + 64 * np.arange(self.words)[:, None] + 4 * lane[:, :, None] + np.arange(4)
        parts.append(words.reshape(GROUP_ROWS, -1))
        return np.concatenate(parts, axis=-1)

    @cached_property
    def sources(self) -> np.ndarray:
        """The inverse of `places`: for each byte of a group's block, its row x block_bytes + byte in the stored."""
        return np.argsort(self.places.ravel())


LAYOUTS = {Q.Q8_0: Layout((2,), 8, 0x80, 1008), Q.Q5_0: Layout((2, 4), 4, 0, 1006)}  # d; d, qh


@dataclass(frozen=True)
class GroupedMatrix(QuantMatrix):
    """A Q8_0 or Q5_0 matrix whose `data` holds the regrouped bytes (same shape and size as the stored rows); only
    the grouped kernel reads `data`, everything else goes through `rows` and `dequantize`."""

    @property
    def c_type(self) -> int:
        return LAYOUTS[self.qtype].c_type

    def rows(self, ids: np.ndarray) -> np.ndarray:
        stored = stored_rows(self.data, np.asarray(ids, np.int64), self.shape[1], LAYOUTS[self.qtype])
        return dequantize_rows(self.qtype, stored, self.shape[1])

    def dequantize(self) -> np.ndarray:
        return self.rows(np.arange(self.shape[0]))


def groupable(matrix: Matrix) -> bool:
    """A Q8_0 or Q5_0 matrix as stored whose rows fill whole groups."""
    return type(matrix) is QuantMatrix and matrix.qtype in LAYOUTS and matrix.shape[0] % GROUP_ROWS == 0


def group(matrix: QuantMatrix) -> GroupedMatrix:
    """The matrix regrouped (a new array, filled a chunk of rows at a time)."""
    out, layout = np.empty_like(matrix.data), LAYOUTS[matrix.qtype]
    for first in range(0, matrix.shape[0], _CHUNK_ROWS):
        rows = matrix.data[first:first + _CHUNK_ROWS]
        out[first:first + len(rows)] = _grouped(rows, matrix.shape[1] // 32, layout)
    return GroupedMatrix(matrix.qtype, matrix.shape, out)


def _grouped(rows: np.ndarray, blocks: int, layout: Layout) -> np.ndarray:
    """Whole groups of stored rows, regrouped: each group's block gathers its 16 rows' bytes (Layout.sources),
    the weights (all after the 16 rows' headers) then flipped."""
    groups, head = len(rows) // GROUP_ROWS, sum(layout.header)
    stored = rows.reshape(groups, GROUP_ROWS, blocks, layout.block_bytes).transpose(0, 2, 1, 3)  # group, block, row
    out = np.take(stored.reshape(groups, blocks, -1), layout.sources, axis=-1)
    out[..., GROUP_ROWS * head:] ^= layout.flip
    return out.reshape(len(rows), -1)


def stored_rows(data: np.ndarray, ids: np.ndarray, cols: int, layout: Layout) -> np.ndarray:
    """Rows `ids` of a regrouped matrix as the file stores them (ids, cols / 32 * block bytes)."""
    blocks, head = cols // 32, sum(layout.header)
    grouped = data.reshape(-1, blocks, GROUP_ROWS * layout.block_bytes)
    where = layout.places[ids % GROUP_ROWS]  # (ids, block bytes): each row's block, in stored order
    picked = grouped[(ids // GROUP_ROWS)[:, None, None], np.arange(blocks)[None, :, None], where[:, None, :]]
    if layout.flip:
        picked[..., head:] ^= layout.flip
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
    return_freed_memory()  # the chunks' temporaries: glibc would keep their heap
    return grouped


def _layer(layer: LayerWeights, regrouped: Callable[[Matrix], Matrix]) -> LayerWeights:
    return dataclasses.replace(layer, wqkv=regrouped(layer.wqkv), wo=regrouped(layer.wo),
                               w_gate_up=regrouped(layer.w_gate_up), w_down=regrouped(layer.w_down))
