"""KV memory sizing: parse a human memory budget and turn it into a number of blocks."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Decimal (SI) and binary (IEC) multipliers; a bare number or "B" means bytes.
_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in "2GiB", "512MiB", "1.5GB" or "1000"; fractional bytes round down. ValueError on junk."""
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a memory size: {text!r} (expected e.g. '2GiB', '512MiB', '1.5GB', '1000')")
    number, unit = match.groups()
    multiplier = _UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}")
    return math.floor(float(number) * multiplier)


@dataclass(frozen=True)
class KVSpec:
    """KV geometry of one model: what one cached token and one block cost in memory."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int = 16
    window_layers: int = 0  # of num_layers, the sliding ones that may keep their KV in a pool of their own
    sliding_window: int = 0  # the positions those layers' queries see

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVSpec.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.window_layers <= self.num_layers or self.sliding_window < 0:
            raise ValueError(f"KVSpec: {self.window_layers} sliding layers of {self.num_layers}, "
                             f"window {self.sliding_window}")

    @property
    def split(self) -> bool:
        """Whether the sliding layers get a pool of their own: some layers slide, and some do not."""
        return 0 < self.window_layers < self.num_layers and self.sliding_window > 0

    @property
    def bytes_per_layer_block(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes * self.block_size

    @property
    def bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def num_blocks_for(self, memory_bytes: int) -> int:
        """Whole blocks that fit in memory_bytes (0 when the budget is below one block)."""
        if memory_bytes < 0:
            raise ValueError(f"memory budget must be >= 0, got {memory_bytes}")
        return memory_bytes // self.bytes_per_block

    def split_blocks_for(self, memory_bytes: int, window_blocks: int) -> tuple[int, int]:
        """(full-layer blocks, window blocks) in memory_bytes when the sliding layers keep `window_blocks` of their
        own (never more than the full layers would get with one pool for all: that saves nothing), the full
        layers the rest."""
        per_block = self.bytes_per_layer_block
        window = min(window_blocks, self.num_blocks_for(memory_bytes))
        left = max(0, memory_bytes - window * per_block * self.window_layers)
        return left // (per_block * (self.num_layers - self.window_layers)), window


def window_table_blocks(window: int, block_size: int, new_tokens: int) -> int:
    """The most blocks a sliding layer's table holds while a step computes `new_tokens` of its tokens: those of
    the first new token's window, up to the last new token."""
    return (window + new_tokens - 3) // block_size + 2


def window_blocks_wanted(window: int, block_size: int, running_seqs: int, step_tokens: int) -> int:
    """Window-pool blocks for `running_seqs` sequences decoding at once, each holding its window's blocks, plus
    one step's prefill chunks (step_tokens, and a block more per sequence for where a chunk ends)."""
    return running_seqs * (window_table_blocks(window, block_size, 1) + 1) + -(-step_tokens // block_size)
