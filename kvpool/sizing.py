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

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVSpec.{name} must be >= 1, got {getattr(self, name)}")

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
