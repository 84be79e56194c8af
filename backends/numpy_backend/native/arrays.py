"""What every C kernel binding needs of an array before passing its address: the dtype, C order, alignment."""

from __future__ import annotations

import numpy as np


def is_c_array(a: np.ndarray, dtype: type) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous and a.flags.aligned


def c_array(a: np.ndarray, dtype: type) -> np.ndarray:
    """`a` itself when C can read it as is, else a C-ordered, aligned copy of it in `dtype`."""
    return a if is_c_array(a, dtype) else np.require(a, dtype, ["C_CONTIGUOUS", "ALIGNED"])
