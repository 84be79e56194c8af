"""Environment defaults the NumPy backend wants in place before NumPy (and so OpenBLAS) is first imported.

OpenBLAS's worker threads busy-wait for 2^28 TSC cycles (about 0.1 s) after each call before they sleep. The
decode-attention kernel runs its own threads between BLAS calls, and a spinning BLAS worker takes the core
from them: on two cores the kernel ran 1.5x slower right after a matmul. 2^20 cycles (about 0.4 ms) still
covers the gaps between a step's BLAS calls, so those keep their warm workers, while the workers sleep during
attention.

The C kernels (native/) share one OpenMP team, whose workers spin 300,000 rounds by default after each
parallel region: long enough to take a core from the BLAS workers of the next matmul in a large batch. Waking
sleeping workers costs much more (about 0.15 ms a region on this VM's futexes; a batch-1 step has 150
regions), so they spin 10,000 rounds, which covers the gap between the regions of a step.

Only defaults: a value the user set is kept. This module imports nothing, so entry points can
apply it first (through backends.process, which the service's launcher calls).
"""

from __future__ import annotations

import os
import sys

DEFAULTS = {"OPENBLAS_THREAD_TIMEOUT": "20", "GOMP_SPINCOUNT": "10000"}


def apply_defaults() -> bool:
    """Set the defaults that are missing; False when NumPy is already loaded, so they came too late."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    return "numpy" not in sys.modules


def reexec_with_defaults(module: str) -> None:
    """Restart `python -m module` with the defaults when any is missing (for benchmarks run by hand)."""
    missing = {name: value for name, value in DEFAULTS.items() if name not in os.environ}
    if missing:
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], {**os.environ, **missing})
