"""What setuptools puts in the package holds every non-Python file the code reads at run time: the C kernels
the NumPy backend compiles on first use and the CUDA sources the CuPy backend compiles (an installed server,
as in the Docker image, has nothing else to read them from)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
PACKAGES = ("service", "backends", "scheduler", "kvpool", "telemetry", "bench")
RUNTIME_SOURCES = [("backends/numpy_backend/native", ("*.c", "*.h")),
                   ("backends/cupy_backend/kernels", ("*.cu", "*.cuh"))]


def test_built_package_holds_the_kernel_sources(tmp_path: Path) -> None:
    """setuptools' build_py is the step of a wheel build that copies packages and their package data. It runs
    on a copy without the checkout's .egg-info, whose file list would otherwise add what package-data misses."""
    source, built = tmp_path / "src", tmp_path / "built"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                           "--build-lib", str(built)], cwd=source, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    wanted = [f.relative_to(REPO) for folder, patterns in RUNTIME_SOURCES for p in patterns
              for f in (REPO / folder).glob(p)]
    assert len(wanted) >= 4
    assert [f for f in wanted if not (built / f).is_file()] == []
