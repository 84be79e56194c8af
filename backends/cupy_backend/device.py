"""What the backend runs on: an array module, a kernel launcher, how to wait for and fetch results, and how to
capture and replay a graph of launches.

`cupy_device()` is the real one (imports CuPy, compiles the kernels with NVRTC). The tests build a CPU one
from NumPy and the emulated kernels, with a stand-in for graph capture; the backend code is the same for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from backends.base import BackendError
from backends.cupy_backend import launch
from backends.cupy_backend.capture import CupyGraphs
from backends.cupy_backend.launcher import CupyLauncher, KernelLauncher, compile_module
from backends.cupy_backend.source import cuda_include_dirs, module_source, option_sets, tensor_cores

T = TypeVar("T")
log = logging.getLogger(__name__)
MISSING_CUPY = "the cupy backend needs CuPy and a CUDA GPU: pip install 'pagedserve[cuda]'"


class GraphCapture(Protocol):
    def capture(self, work: Callable[[], T]) -> tuple[Any, T]:
        """Runs `work` with its launches captured (recorded, not run): the graph, and what `work` returned (arrays
        the graph writes on each replay, kept alive by the caller)."""
        ...

    def replay(self, graph: Any) -> None:
        """Runs a captured graph again, in order with the work before it."""
        ...

    def memory_bytes(self) -> int:
        """Device memory the captured graphs' intermediate arrays hold."""
        ...


def _no_sync() -> None:
    """NumPy work is finished when the call returns."""


@dataclass(frozen=True)
class Device:
    xp: Any  # numpy or cupy
    launcher: KernelLauncher
    synchronize: Callable[[], None] = _no_sync
    to_host: Callable[[Any], np.ndarray] = np.asarray
    name: str = "cpu"
    info: dict[str, Any] = field(default_factory=dict)
    graphs: GraphCapture | None = None  # None: this device captures no graphs (decode steps stay eager)
    shared_mem_per_block: int = 0  # the most dynamic shared memory a kernel may opt into; 0: unknown, no limit


def import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - only when the cupy backend is created
    except ImportError as exc:
        raise BackendError(f"{MISSING_CUPY} ({exc})") from None
    return cupy


def cupy_device() -> Device:
    """The current CUDA device, with every kernel compiled (once per source; CuPy caches the binary)."""
    cupy = import_cupy()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, no device: CUDARuntimeError and friends
        raise BackendError(f"CuPy sees no CUDA device ({exc}); the cupy backend needs a GPU") from None
    if count == 0:
        raise BackendError("CuPy sees no CUDA device; the cupy backend needs a GPU")
    extra = cuda_include_dirs()
    try:
        module, options = compile_module(cupy, module_source(), option_sets(extra), launch.all_kernel_names())
    except RuntimeError as exc:
        raise BackendError(str(exc)) from None
    if not tensor_cores(options):
        log.warning("<mma.h> is neither NVRTC's nor in %s: the quantized GEMM runs on the CUDA cores, not the "
                    "tensor cores (set CUDA_PATH to a CUDA toolkit)", extra or "a CUDA toolkit or wheel found")
    stream_sync = cupy.cuda.get_current_stream
    return Device(
        xp=cupy,
        launcher=CupyLauncher(cupy, module),
        synchronize=lambda: stream_sync().synchronize(),
        to_host=cupy.asnumpy,
        name=_device_name(cupy),
        info={"cupy": cupy.__version__, "nvrtc_options": options, "tensor_cores": tensor_cores(options)},
        graphs=CupyGraphs.create(cupy),
        shared_mem_per_block=int(_properties(cupy).get("sharedMemPerBlockOptin", 0)),
    )


def _properties(cupy: Any) -> dict[str, Any]:
    return dict(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id))


def _device_name(cupy: Any) -> str:
    name = _properties(cupy).get("name", b"CUDA device")
    return name.decode() if isinstance(name, bytes) else str(name)
