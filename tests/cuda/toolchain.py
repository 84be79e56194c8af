"""Finding nvcc / g++ and building the kernels with them, for the compile check and the CPU emulation.

With CI=true a missing compiler fails the test; elsewhere the test skips with the reason.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from backends.cupy_backend import launch
from tests import required
from tests.background import niced

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


def cache_dir(kind: str) -> Path:
    """Builds kept between runs, beside the native kernels' cache (backends/numpy_backend/native/build.py)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pagedserve" / kind


def emu_cache_dir() -> Path:
    return cache_dir("cuda_emu")


def cached_nvcc(nvcc: str, source: Path, arch: str, out_dir: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One kernel source compiled to a cubin, and nvcc's result. nvcc takes about 35 s of the suite for every
    source and arch, so a cubin built from the same kernel sources, flags and nvcc is taken from the cache,
    with that build's output (its warnings)."""
    cmd = nvcc_command(nvcc, source, arch, out_dir)
    cubin = Path(cmd[-1])
    digest = hashlib.sha256(_version(nvcc).encode())
    digest.update(" ".join(arg.replace(str(out_dir), "OUT") for arg in cmd[1:]).encode())
    _hash_files(digest, sorted(KERNEL_DIR.iterdir()))
    cached = cache_dir("cubins") / f"{cubin.stem}-{digest.hexdigest()[:16]}.cubin"
    if cached.exists() and cached.with_suffix(".log").exists():
        return subprocess.CompletedProcess(cmd, 0, cached.with_suffix(".log").read_text(), ""), cached
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode == 0:
        _store(cubin, done.stdout + done.stderr, cached)
    return done, cubin


@dataclass(frozen=True)
class EmuBuild:
    """An emulation library: being built by g++ (`proc`), or found in the cache, built from the same inputs by
    an earlier run (`proc` None), with that build's output so its warnings are still reported."""

    lib: Path
    proc: subprocess.Popen[str] | None = None
    cached_log: str = ""
    cache_as: Path | None = None  # where a successful build is kept

    def wait(self, timeout: float) -> tuple[int, str]:
        """g++'s exit status and output; a successful build is copied into the cache."""
        if self.proc is None:
            return 0, self.cached_log
        log, _ = self.proc.communicate(timeout=timeout)
        if self.proc.returncode == 0 and self.cache_as is not None:
            _store(self.lib, log, self.cache_as)
        return self.proc.returncode, log


def start_emu_build(gxx: str, out_dir: Path, sanitizer: str) -> EmuBuild:
    """The emulation library of every kernel source: cached, else a g++ build started (the caller waits), so two
    builds can share the cores."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_emu_includes(out_dir)
    return cached_emu_build(gxx, out_dir, sanitizer)


def cached_emu_build(gxx: str, out_dir: Path, sanitizer: str) -> EmuBuild:
    """out_dir holds the build's generated includes. Builds take 10-40 s of the suite, so one made from the same
    inputs (those includes, tests/cuda_emu, the kernel sources, flags, g++'s version) is taken from the cache."""
    cmd, lib = emu_build_command(gxx, out_dir, sanitizer)
    cached = emu_cache_dir() / f"{lib.stem}-{_emu_build_key(gxx, cmd, out_dir)}.so"
    if cached.exists() and cached.with_suffix(".log").exists():
        return EmuBuild(cached, cached_log=cached.with_suffix(".log").read_text())
    proc = subprocess.Popen(niced(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return EmuBuild(lib, proc, cache_as=cached)


def _emu_build_key(gxx: str, cmd: list[str], out_dir: Path) -> str:
    digest = hashlib.sha256(_version(gxx).encode())
    digest.update(" ".join(arg.replace(str(out_dir), "OUT") for arg in cmd[1:]).encode())
    _hash_files(digest, [*sorted(out_dir.iterdir()), *sorted(EMU_DIR.iterdir()), *sorted(KERNEL_DIR.iterdir())])
    return digest.hexdigest()[:16]


@functools.cache
def _version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout


def _hash_files(digest: hashlib._Hash, paths: list[Path]) -> None:
    """Names and contents of the sources among `paths` (not the outputs of an earlier build beside them)."""
    for path in paths:
        if path.is_file() and path.suffix not in (".so", ".cubin"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())


def _store(lib: Path, log: str, target: Path) -> None:
    """Copies a fresh build into the cache, its log first: a library without its log is not used, and a
    concurrent run sees whole files only (each is written to a temporary name, then renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for path, data in ((target.with_suffix(".log"), log.encode()), (target, lib.read_bytes())):
        fd, tmp = tempfile.mkstemp(dir=target.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)


def tsan_runtime(gxx: str) -> str | None:
    """The ThreadSanitizer runtime to preload into a Python that loads an instrumented library."""
    out = subprocess.run([gxx, "-print-file-name=libtsan.so"], capture_output=True, text=True, check=False)
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None
