"""How each backend dtype is stored in arrays, written against the array module `xp` (numpy or cupy).

float32 and float16 are native. bfloat16 is kept as its raw 16-bit pattern in uint16 arrays: the kernels read
`__nv_bfloat16` through a pointer, so only the bits matter, and neither NumPy nor every CuPy release has a
bfloat16 dtype. Only the GEMMs (gemm.py) and the host need to know; everything else moves or indexes bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Storage:
    name: str  # launch.py's dtype name: float32 | float16 | bfloat16
    dtype: type[np.generic]  # the array dtype that holds it

    @property
    def itemsize(self) -> int:
        return int(np.dtype(self.dtype).itemsize)

    @property
    def is_bf16(self) -> bool:
        return self.name == "bfloat16"

    def encode(self, xp: Any, x: Any) -> Any:
        """A float32 array -> this storage (bf16: round to nearest even, as __float2bfloat16_rn)."""
        if self.is_bf16:
            return bf16_encode(xp, x)
        return x.astype(self.dtype, copy=False)

    def decode(self, xp: Any, a: Any) -> Any:
        """This storage -> float32."""
        if self.is_bf16:
            return bf16_decode(xp, a)
        return a.astype(xp.float32, copy=False)


STORAGES = {
    "float32": Storage("float32", np.float32),
    "float16": Storage("float16", np.float16),
    "bfloat16": Storage("bfloat16", np.uint16),
}


def storage_for(dtype: str) -> Storage:
    if dtype not in STORAGES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(STORAGES)}")
    return STORAGES[dtype]


def bf16_encode(xp: Any, x: Any) -> Any:
    """float32 -> bfloat16 bits, rounding to nearest even (NaN inputs are not expected in weights or
    activations; they would round to an infinity or another NaN pattern)."""
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
    return rounded.astype(xp.uint16)


def bf16_decode(xp: Any, bits: Any) -> Any:
    """bfloat16 bits -> float32 (exact)."""
    return (xp.ascontiguousarray(bits).astype(xp.uint32) << xp.uint32(16)).view(xp.float32)
