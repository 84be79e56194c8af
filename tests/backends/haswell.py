"""The matmul kernels built for a Haswell (AVX2 and FMA, no AVX-512, no VNNI) and run on this machine: the paths
a CPU without the newer instructions takes, checked where the tests run."""

from __future__ import annotations

import subprocess
from pathlib import Path

from backends.numpy_backend.native.build import OPENMP, SOURCE_DIR
from backends.numpy_backend.native.matmul import NativeMatmul
from tests.backends.compiler import flags_for


def has_avx2() -> bool:
    try:
        return " avx2 " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "
    except OSError:
        return False


def build_haswell(c_compiler: str, directory: Path) -> Path:
    library = directory / "matmul_haswell.so"
    done = subprocess.run([c_compiler, *flags_for("-march=haswell"), *OPENMP, "-o", str(library),
                           str(SOURCE_DIR / "matmul_rows.c"), "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return library


def haswell_matmul(library: Path, fast: bool) -> NativeMatmul:
    """A NativeMatmul bound to the Haswell build: its kernels, and its own answers to what they do."""
    return NativeMatmul(library_path=library, fast=fast)
