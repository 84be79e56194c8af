"""The CPU stand-in for a GPU: NumPy arrays and the kernels' exact NVRTC source run through the emulation
library (tests/cuda_emu), so CupyBackend's code runs unchanged with xp = numpy; graph capture through the
recording stand-in of emu_graphs.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from backends.cupy_backend import launch
from backends.cupy_backend.device import Device
from backends.cupy_backend.launch import Launch
from backends.cupy_backend.source import module_source
from tests.cuda import toolchain
from tests.cuda.emu_lib import EmuLib
from tests.cupy_backend.emu_graphs import Tape, TapeGraphs, record_call

MODULE_FILE = "module_source.cu"


class RecordingLauncher:
    """Launches through the emulation and remembers each kernel name as it runs, so a test can tell which paths
    ran; while a capture is under way (`tape` set), records the launches and calls instead of running them."""

    def __init__(self, lib: EmuLib) -> None:
        self.lib = lib
        self.names: list[str] = []
        self.tape: Tape | None = None

    def launch(self, spec: Launch, args: Sequence[Any]) -> None:
        if self.tape is None:
            self.run(spec, tuple(args))
            return
        self.tape.ops.append(partial(self.run, spec, tuple(args)))
        self.tape.kernels.append(spec.name)

    def run(self, spec: Launch, args: tuple[Any, ...]) -> None:
        self.names.append(spec.name)
        self.lib.launch(spec, args)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if self.tape is None else record_call(self.tape, fn, args)


def emu_device(library: Path) -> tuple[Device, RecordingLauncher]:
    launcher = RecordingLauncher(EmuLib(str(library)))
    return Device(xp=np, launcher=launcher, name="cpu-emulation", graphs=TapeGraphs(launcher)), launcher


def start_build(gxx: str, out_dir: Path) -> toolchain.EmuBuild:
    """The emulation library built from the very source text the backend gives NVRTC (source.module_source),
    rather than from the .cu files one by one: cached, else a g++ build started (the caller waits)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MODULE_FILE).write_text(module_source())
    (out_dir / "emu_sources.inc").write_text(f'#include "{MODULE_FILE}"\n')
    registry = "".join(f"    EMU_KERNEL({name}),\n" for name in launch.all_kernel_names())
    (out_dir / "emu_registry.inc").write_text(registry)
    return toolchain.cached_emu_build(gxx, out_dir, "")
