"""The C compiler the NumPy backend's native kernels are built with, for the tests of those kernels: missing, it
fails the test under CI=true and skips it elsewhere (the backend then runs its NumPy code, tested on its own)."""

from __future__ import annotations

import os
import platform
import shlex
import shutil

from backends.numpy_backend.native.build import FLAGS
from tests import required

KERNEL_CHECKS = "the NumPy backend's C kernel tests"


def require_c_compiler() -> str:
    """The path of what backends.numpy_backend.native.build runs ($CC, else cc)."""
    command = os.environ.get("CC", "cc")
    words = shlex.split(command)
    found = shutil.which(words[0]) if words else None
    if found is None:
        required.unavailable(f"no C compiler: {command!r} not found on PATH", KERNEL_CHECKS)
    return found


def require_gcc() -> str:
    found = shutil.which("gcc")
    if found is None:
        required.unavailable("no gcc on PATH", KERNEL_CHECKS)
    return found


# This machine's build, and on x86 one for a CPU without AVX2, F16C or FMA (the kernels' plain paths; -Wpsabi
# notes that 8-float vectors pass differently without AVX, which no caller outside the library sees).
ARCHES = ["-march=native", *(["-march=x86-64-v2 -Wno-psabi"] if platform.machine() in ("x86_64", "AMD64") else [])]


def flags_for(arch: str) -> list[str]:
    """The kernels' build flags for another target: `arch` (e.g. "-march=haswell") in place of -march=native."""
    return [*(f for f in FLAGS if not f.startswith("-march=")), *arch.split()]
