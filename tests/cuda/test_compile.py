"""Every kernel source compiles with nvcc to a cubin for each target architecture; nvcc/ptxas warnings
(spills, local memory, double-precision use) are surfaced in pytest's warnings summary."""

from __future__ import annotations

import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from backends.cupy_backend import launch
from tests.cuda import toolchain

Results = dict[tuple[str, str], tuple[subprocess.CompletedProcess[str], Path]]
SOURCES = tuple(path.name for path in toolchain.kernel_sources())


@pytest.fixture(scope="session")
def cubins(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """All (source, arch) compilations, two nvcc processes at a time, or their cached results."""
    nvcc = toolchain.require("nvcc")
    out_dir = tmp_path_factory.mktemp("cubins")
    jobs = [(src, arch) for src in toolchain.kernel_sources() for arch in toolchain.CUDA_ARCHS]

    def build(job: tuple[Path, str]) -> tuple[subprocess.CompletedProcess[str], Path]:
        return toolchain.cached_nvcc(nvcc, job[0], job[1], out_dir)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(build, jobs))
    return {(src.name, arch): result for (src, arch), result in zip(jobs, done, strict=True)}


def test_kernel_sources_found() -> None:
    assert SOURCES, f"no .cu files in {toolchain.KERNEL_DIR}"


@pytest.mark.parametrize("arch", toolchain.CUDA_ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_to_cubin(source: str, arch: str, cubins: Results) -> None:
    proc, cubin = cubins[source, arch]
    log = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0, f"nvcc {source} for {arch} failed:\n{log}"
    if log:
        warnings.warn(toolchain.BuildWarning(f"nvcc {source} ({arch}):\n{log}"), stacklevel=1)
    assert cubin.stat().st_size > 0


@pytest.mark.parametrize("arch", toolchain.CUDA_ARCHS)
def test_every_launch_name_is_exported(arch: str, cubins: Results) -> None:
    """The unmangled names launch.py hands to RawModule.get_function exist in the cubins."""
    blob = b"".join(
        cubin.read_bytes() for (_, a), (proc, cubin) in cubins.items() if a == arch and proc.returncode == 0
    )
    missing = [name for name in launch.all_kernel_names() if name.encode() + b"\0" not in blob]
    assert not missing, f"kernels missing from the {arch} cubins: {missing}"
