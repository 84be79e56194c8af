"""Finding nvcc / g++ and building the kernels with them, for the compile check and the CPU emulation.

With CI=true a missing compiler fails the test; elsewhere the test skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

from backends.cupy_backend import launch
from tests import required

REPO = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO / "backends" / "cupy_backend" / "kernels"
EMU_DIR = REPO / "tests" / "cuda_emu"
CUDA_ARCHS = ("sm_80", "sm_90")
# ptxas warns about spills, local memory and (accidental) double-precision math.
NVCC_FLAGS = ("-std=c++17", "-O3", "-Xptxas", "-warn-spills,-warn-lmem-usage,-warn-double-usage")
GXX_FLAGS = ("-std=c++20", "-fPIC", "-shared", "-pthread", "-fno-strict-aliasing", "-Wall", "-Wextra")
# g++ does not know `#pragma unroll`; the kernels keep it for nvcc.
GXX_QUIET = ("-Wno-unknown-pragmas",)


class BuildWarning(UserWarning):
    """A compiler printed warnings for a kernel or emulation build (shown in pytest's warnings summary)."""


def unavailable(message: str) -> NoReturn:
    """A tool the test needs is missing: fail under CI, where these checks must run; skip elsewhere."""
    required.unavailable(message, "the CUDA kernel checks")


def require(tool: str) -> str:
    """Path of `tool`, or fail (CI) / skip (elsewhere) the calling test."""
    path = find(tool)
    if path is None:
        unavailable(f"{tool} not found on PATH (or under CUDA_HOME / /usr/local/cuda/bin)")
    return path


def find(tool: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / tool).is_file():
            return str(Path(root) / "bin" / tool)
    return None


def kernel_sources() -> list[Path]:
    return sorted(KERNEL_DIR.glob("*.cu"))


def nvcc_command(nvcc: str, source: Path, arch: str, out_dir: Path) -> list[str]:
    cubin = out_dir / f"{source.stem}.{arch}.cubin"
    return [nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-I", str(KERNEL_DIR), str(source), "-o", str(cubin)]


def sanitizer_flags(sanitizer: str) -> tuple[str, ...]:
    """g++ flags of an emulation build: '' plain and optimised, 'thread' with ThreadSanitizer."""
    if sanitizer == "":
        return ("-O1",)
    if sanitizer == "thread":
        return ("-O1", "-g", "-fsanitize=thread")
    raise ValueError(f"unknown sanitizer {sanitizer!r}")


def write_emu_includes(out_dir: Path) -> None:
    """The two includes emu_driver.cpp expects: every kernel source, and a registry of every kernel name."""
    sources = "".join(f'#include "{path}"\n' for path in kernel_sources())
    (out_dir / "emu_sources.inc").write_text(sources)
    registry = "".join(f"    EMU_KERNEL({name}),\n" for name in launch.all_kernel_names())
    (out_dir / "emu_registry.inc").write_text(registry)


def emu_build_command(gxx: str, out_dir: Path, sanitizer: str) -> tuple[list[str], Path]:
    lib = out_dir / f"libcuda_emu{'_' + sanitizer if sanitizer else ''}.so"
    flags = [*GXX_FLAGS, *GXX_QUIET, *sanitizer_flags(sanitizer)]
    includes = ["-I", str(out_dir), "-I", str(EMU_DIR), "-I", str(KERNEL_DIR)]
    return [gxx, *flags, *includes, str(EMU_DIR / "emu_driver.cpp"), "-o", str(lib)], lib


def start_emu_build(gxx: str, out_dir: Path, sanitizer: str) -> tuple[subprocess.Popen[str], Path]:
    """Starts a g++ build of the emulation library (the caller waits), so two builds can share the cores."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_emu_includes(out_dir)
    cmd, lib = emu_build_command(gxx, out_dir, sanitizer)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, lib


def tsan_runtime(gxx: str) -> str | None:
    """The ThreadSanitizer runtime to preload into a Python that loads an instrumented library."""
    out = subprocess.run([gxx, "-print-file-name=libtsan.so"], capture_output=True, text=True, check=False)
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None
