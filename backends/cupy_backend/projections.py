"""Every product of the forward with a weight matrix, y = x @ w.T, and the embedding lookup, whichever way the
weight is kept on the device.

A dense weight (a device array in the storage dtype) goes through the GEMM (gemm.py) and plain indexing. A
weight kept as stored (DeviceQuant) is read as stored, never widened into a dense copy:
  - the dequantizing GEMV for 1..launch.QUANT_GEMV_MAX_ROWS rows (decode steps, the sampled rows' logits):
    the stored bytes are all a step reads of that matrix;
  - the dequantizing GEMM for more rows (prefill chunks, large decode batches): every 64 rows read the
    matrix's blocks once, dequantizing them tile by tile into shared memory (rounded to the storage dtype, as a
    dense copy would be) for the tensor cores;
  - the embedding lookup dequantizes only the step's tokens' rows.
The GEMMs and the dense lookup run through the launcher's `call` (launcher.py), in order with the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.cupy_backend.gemm import Gemm
from backends.cupy_backend.quant_ops import QuantKernels
from backends.cupy_backend.quant_weights import DeviceQuant


@dataclass(frozen=True)
class Projections:
    gemm: Gemm
    quant: QuantKernels

    def linear(self, x: Any, w: Any) -> Any:
        """(M, K) x (N, K) weights -> (M, N), in the storage dtype."""
        if not isinstance(w, DeviceQuant):
            return self.quant.launcher.call(self.gemm.linear, x, w)
        return self.quant.product(x, w)

    def logits(self, x: Any, w: Any) -> Any:
        """(M, K) x (N, K) weights -> (M, N) float32, for sampling."""
        if not isinstance(w, DeviceQuant):
            return self.quant.launcher.call(self.gemm.logits, x, w)
        return self.quant.product(x, w, logits=True)

    def embed(self, w: Any, ids: Any) -> Any:
        """Rows `ids` (int32 device array) of the embedding, in the storage dtype."""
        return self.quant.rows(w, ids) if isinstance(w, DeviceQuant) else self.quant.launcher.call(take_rows, w, ids)


def take_rows(a: Any, rows: Any) -> Any:
    """Rows `rows` (a device index array) of `a`, as a new array."""
    return a[rows]
