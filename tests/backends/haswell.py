"""The matmul kernels built for a Haswell (AVX2 and FMA, no AVX-512, no VNNI) and run on this machine: the paths
a CPU without the newer instructions takes, checked where the tests run."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

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


def haswell_matmul(library: Path, like: NativeMatmul, fast: bool) -> NativeMatmul:
    """A NativeMatmul whose kernels are the Haswell build's; `like` gives the bindings' types."""
    haswell = NativeMatmul(cache_dir=like.library_path.parent)
    built = ctypes.CDLL(str(library))
    haswell._fn = _bind_like(built.matmul_weights_f32, like._fn)
    haswell._dequantize = _bind_like(built.dequantize_f32, like._dequantize)
    haswell.fast_uses_tiles, haswell.fast_small_steps = False, bool(built.fast_small_steps())
    haswell.fast = fast
    return haswell


def _bind_like(fn: Any, like: Any) -> Any:
    fn.restype, fn.argtypes = like.restype, like.argtypes
    return fn
