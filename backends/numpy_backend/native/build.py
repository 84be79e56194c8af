"""Compile the C kernels beside this file into a shared library, once per source, CPU tier, compiler and CPU.

The library is built for a CPU tier (cpu_tiers.py: the instruction set, `-march=x86-64-v3` for AVX2 say) and
tuned for the machine it runs on, so it is compiled on first use rather than at install time, and cached under
the user's cache directory keyed by a hash of everything that affects the binary. Concurrent first uses are
safe: each compiles to a private temporary name and renames it into place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from backends.numpy_backend.native.cpu_tiers import CpuInfo, CpuTier

SOURCE_DIR = Path(__file__).parent
FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno")  # and a tier's; tests add -Wall -Werror
OPENMP = ("-fopenmp",)  # the kernels' threads; a compiler without OpenMP builds them single-threaded


log = logging.getLogger(__name__)


class KernelBuildError(RuntimeError):
    """No C compiler, no kernel source, an unwritable cache, or the kernels did not compile."""


class CompileError(KernelBuildError):
    """The compiler ran and rejected the build."""


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pagedserve" / "kernels"


def build_library(source: Path, tier: CpuTier, cache_dir: Path | None = None, compiler: str | None = None) -> Path:
    """Path of the compiled library for the C file `source` and `tier`, compiling it if this build is not cached
    yet."""
    cc = compiler or os.environ.get("CC", "cc")
    flags, what = (*FLAGS, *tier_flags(tier)), f"{source.stem}, tier {tier.name}"
    try:
        return _cached_build(cc, (*flags, *OPENMP), source, cache_dir, what)
    except CompileError as exc:  # most likely no OpenMP (clang without libomp): build single-threaded
        log.warning("building %s without OpenMP, so its kernels run on one thread: %s", source.name, exc)
        return _cached_build(cc, flags, source, cache_dir, what)
    except OSError as exc:  # the source or a header could not be read (an install without them)
        raise KernelBuildError(f"cannot read the kernel source {source}: {exc}") from exc


def tier_flags(tier: CpuTier, host: CpuInfo | None = None) -> tuple[str, ...]:
    """The tier's target flags, tuned for this CPU when it is one of the host's (the tuning changes the
    instructions' order, never which instructions may run)."""
    own = tier.machine == (host or CpuInfo.of_this_host()).machine
    return (*tier.arch_flags, *(("-mtune=native",) if own else ()))


def _cached_build(cc: str, flags: tuple[str, ...], source: Path, cache_dir: Path | None, what: str) -> Path:
    target = (cache_dir or default_cache_dir()) / f"{source.stem}-{_build_key(source, cc, flags)}.so"
    if not target.exists():
        start = time.perf_counter()
        _compile(cc, flags, source, target)
        # once per source, compiler and CPU, on first use: why this start is slower than the next ones
        log.info("compiled native kernels (%s) in %.1f s", what, time.perf_counter() - start)
    return target


def _compile(cc: str, flags: tuple[str, ...], source: Path, target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    except OSError as exc:
        raise KernelBuildError(f"cannot write the kernel cache {target.parent}: {exc}") from exc
    os.close(fd)
    command = [*shlex.split(cc), *flags, "-o", tmp, str(source), "-lm"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        os.unlink(tmp)
        raise KernelBuildError(f"cannot run {cc}: {exc}") from exc
    if done.returncode != 0:
        os.unlink(tmp)
        raise CompileError(f"{shlex.join(command)} failed: {done.stderr.strip()[-2000:]}")
    os.replace(tmp, target)


def _build_key(source: Path, cc: str, flags: tuple[str, ...]) -> str:
    """Hash of the source and the headers beside it, flags, compiler version and CPU: any change gives a new
    library file."""
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.read_bytes())
    digest.update(" ".join(flags).encode())
    digest.update(_compiler_version(cc).encode())
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()[:16]


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return cc


def _cpu_identity() -> str:
    """Model name and feature flags of the first CPU (-mtune=native depends on both)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(wanted))
