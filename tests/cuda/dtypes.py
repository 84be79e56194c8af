"""Host-side storage of the kernel dtypes: float32 and float16 natively, bfloat16 as its uint16 bit pattern
(NumPy has no bfloat16), with round-to-nearest-even encoding and the comparison tolerances per dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def bf16_bits(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float32 -> bfloat16 bits, rounding to nearest even; NaN stays NaN."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_value(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class DType:
    name: str  # launch.py's dtype name
    storage: type[np.generic]
    atol: float
    rtol: float

    def encode(self, x: npt.ArrayLike) -> npt.NDArray[np.generic]:
        if self.name == "bfloat16":
            return bf16_bits(x)
        with np.errstate(over="ignore"):  # out-of-range values become inf, as on the GPU
            return np.asarray(x, dtype=np.float32).astype(self.storage)

    def decode(self, a: npt.NDArray[np.generic]) -> F64:
        if self.name == "bfloat16":
            return bf16_value(a.view(np.uint16)).astype(np.float64)
        return a.astype(np.float64)

    def round_trip(self, x: npt.ArrayLike) -> F64:
        """The values the kernel actually sees after storing x in this dtype."""
        return self.decode(self.encode(x))


# Tolerances: float32 accumulates like the float64 reference up to summation order; the 16-bit types are
# dominated by rounding the output (2^-11 and 2^-8 relative) plus the rounded intermediates of fused ops.
# In units of those roundings, not measured (GPU and g++ emulation runs only): float16 rtol 8 x 2^-11, atol 4 x 2^-11;
# bfloat16 rtol 7.7 x 2^-8, atol 4 x 2^-8; float32 2e-5 is ~170 x 2^-23, room for float32 sums of a few hundred terms.
FLOAT32 = DType("float32", np.float32, 2e-5, 2e-5)
FLOAT16 = DType("float16", np.float16, 2e-3, 4e-3)
BFLOAT16 = DType("bfloat16", np.uint16, 1.6e-2, 3e-2)
ALL = (FLOAT32, FLOAT16, BFLOAT16)


def by_short_name(short: str) -> DType:
    return {"f32": FLOAT32, "f16": FLOAT16, "bf16": BFLOAT16}[short]
