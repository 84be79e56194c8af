"""Launching a kernel described by a `launch.Launch`. The backend only sees the `KernelLauncher` protocol, so the
same forward runs the real kernels through CuPy on a GPU, or the same sources through the CPU emulation on
NumPy arrays in the tests.

The forward's other array work (GEMMs, gathers, the graph's sampling) goes through the launcher's `call`, so that
everything a decode step runs passes one place in order: on a GPU `call` just runs it (a CUDA graph capture sees
it on the stream), while the emulation's stand-in for a capture records it beside the kernels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from backends.cupy_backend.launch import DEFAULT_SHARED_MEM, Launch

# NVRTC failures are reported with the end of the compiler log: enough for the error, short enough to read.
LOG_TAIL = 4000

log = logging.getLogger(__name__)


class KernelLauncher(Protocol):
    def launch(self, spec: Launch, args: Sequence[Any]) -> None:
        """Run spec.name over spec.grid x spec.block with args typed by spec.arg_types ('p' an array)."""
        ...

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args): array work other than our kernels, in order with them; returns fn's new array(s)."""
        ...


def _scalar(code: str, value: Any) -> Any:
    """CuPy passes a Python int as a 64-bit value: every scalar gets the exact C type of its parameter."""
    if code == "i":
        return np.int32(value)
    if code == "q":
        return np.int64(value)
    if code == "f":
        return np.float32(value)
    raise ValueError(f"unknown argument type {code!r}")


class CupyLauncher:
    """Kernels of one cupy.RawModule, looked up by their extern "C" names once and cached."""

    def __init__(self, cupy: Any, module: Any) -> None:
        self._cupy = cupy
        self._module = module
        self._kernels: dict[str, Any] = {}

    def kernel(self, name: str) -> Any:
        fn = self._kernels.get(name)
        if fn is None:
            fn = self._kernels[name] = self._module.get_function(name)
        return fn

    def launch(self, spec: Launch, args: Sequence[Any]) -> None:
        if len(args) != len(spec.arg_types):
            raise TypeError(f"{spec.name} takes {len(spec.arg_types)} arguments, got {len(args)}")
        converted = tuple(self._arg(code, value) for code, value in zip(spec.arg_types, args, strict=True))
        kernel = self.kernel(spec.name)
        if spec.shared_mem > DEFAULT_SHARED_MEM and kernel.max_dynamic_shared_size_bytes < spec.shared_mem:
            # past the default 48 KiB a kernel must opt in (cudaFuncSetAttribute), once per kernel
            kernel.max_dynamic_shared_size_bytes = spec.shared_mem
        kernel(spec.grid, spec.block, converted, shared_mem=spec.shared_mem)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def _arg(self, code: str, value: Any) -> Any:
        if code != "p":
            return _scalar(code, value)
        if not isinstance(value, self._cupy.ndarray):
            raise TypeError(f"pointer argument must be a device array, got {type(value).__name__}")
        return value


def compile_module(
    cupy: Any, source: str, option_sets: Sequence[tuple[str, ...]], names: Sequence[str]
) -> tuple[Any, tuple[str, ...]]:
    """A RawModule for `source` and the options that built it, compiled now (not at the first launch) by
    loading `names`. Tries each option set in turn (e.g. without, then with explicit CUDA include directories);
    raises RuntimeError with every attempt's log if none compiles."""
    errors = []
    start = time.perf_counter()
    for options in option_sets:
        try:
            module = cupy.RawModule(code=source, options=options)
            for name in names:
                module.get_function(name)
        except Exception as exc:  # noqa: BLE001 - CompileException, or a missing header surfacing otherwise
            errors.append(f"options {options}: {type(exc).__name__}: {str(exc)[-LOG_TAIL:]}")
            continue
        # NVRTC on the first start after a change to the sources; later starts load CuPy's cached binary
        log.info("compiled CUDA kernels (%d, NVRTC) in %.1f s", len(names), time.perf_counter() - start)
        return module, options
    raise RuntimeError("NVRTC could not compile the kernels:\n" + "\n".join(errors))
