"""The C compiler the NumPy backend's native kernels are built with, for the tests of those kernels: missing, it
fails the test under CI=true and skips it elsewhere (the backend then runs its NumPy code, tested on its own)."""

from __future__ import annotations

import os
import shlex
import shutil

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
