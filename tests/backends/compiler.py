"""The C compiler the NumPy backend's native kernels are built with, for the tests of those kernels: missing, it
fails the test under CI=true and skips it elsewhere (the backend then runs its NumPy code, tested on its own)."""

from __future__ import annotations

import os
import shlex
import shutil

from backends.numpy_backend.native.build import FLAGS, tier_flags
from backends.numpy_backend.native.cpu_tiers import TIERS, CpuTier
from tests import required
from tests.backends.tiers import HOST

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


# Every tier of this machine's architecture, for the tests that only compile (the CPU need not run them all).
OWN_TIERS = tuple(tier for tier in TIERS if tier.machine == HOST.machine)


def flags_for(tier: CpuTier) -> list[str]:
    """The kernels' build flags for `tier`, as backends.numpy_backend.native.build gives them."""
    return [*FLAGS, *tier_flags(tier)]
