"""The dequantizing kernels' calls: the GEMV on a stored matrix for decode-sized batches, the GEMM for larger
ones, and rows of a stored matrix dequantized into the storage dtype (an embedding lookup, or a whole matrix).
Geometry from launch.py, arguments in the kernels' order, outputs allocated here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.cupy_backend import launch
from backends.cupy_backend.launcher import KernelLauncher
from backends.cupy_backend.quant_weights import DeviceQuant
from backends.cupy_backend.storage import Storage


@dataclass(frozen=True)
class QuantKernels:
    xp: Any
    launcher: KernelLauncher
    storage: Storage

    def gemv(self, x: Any, w: DeviceQuant, logits: bool = False) -> Any:
        """x (rows, k) @ w.T for 1..launch.QUANT_GEMV_MAX_ROWS rows: storage dtype, or float32 logits."""
        return self._launch_product(launch.quant_gemv, x, w, logits)

    def gemm(self, x: Any, w: DeviceQuant, logits: bool = False) -> Any:
        """x (rows, k) @ w.T for any number of rows, w's blocks dequantized tile by tile in shared memory."""
        return self._launch_product(launch.quant_gemm, x, w, logits)

    def _launch_product(self, kernel: Callable[..., launch.Launch], x: Any, w: DeviceQuant, logits: bool) -> Any:
        rows, (n, k) = int(x.shape[0]), w.shape
        out = self.xp.empty((rows, n), dtype=self.xp.float32 if logits else self.storage.dtype)
        if rows:
            spec = kernel(w.qtype, self.storage.name, rows, n, k, logits)
            self.launcher.launch(spec, [out, self.xp.ascontiguousarray(x), w.data, rows, n, k])
        return out

    def product(self, x: Any, w: DeviceQuant, logits: bool = False) -> Any:
        """x @ w.T by the GEMV up to launch.QUANT_GEMV_MAX_ROWS rows, else by the GEMM."""
        if x.shape[0] <= launch.QUANT_GEMV_MAX_ROWS:
            return self.gemv(x, w, logits)
        return self.gemm(x, w, logits)

    def rows(self, w: DeviceQuant, ids: Any) -> Any:
        """Rows `ids` (an int32 device array) of w, (len(ids), k) in the storage dtype."""
        num_rows, k = int(ids.shape[0]), w.shape[1]
        out = self.xp.empty((num_rows, k), dtype=self.storage.dtype)
        if num_rows:
            spec = launch.dequantize(w.qtype, self.storage.name, num_rows, k)
            self.launcher.launch(spec, [out, w.data, self.xp.ascontiguousarray(ids, dtype=self.xp.int32), k])
        return out

    def dense(self, w: DeviceQuant) -> Any:
        """The whole matrix in the storage dtype (what a dense upload holds; the benchmarks' comparison)."""
        return self.rows(w, self.xp.arange(w.shape[0], dtype=self.xp.int32))
