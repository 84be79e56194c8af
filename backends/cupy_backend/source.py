"""The CUDA source handed to NVRTC: every `kernels/*.cu` in one translation unit, with our own `#include "..."`
headers inlined. Inlining matters because CuPy's kernel cache is keyed on the source text and options: a
header that changed behind an `#include` would otherwise be served stale from the cache. The emulation build
compiles the same files into one translation unit too, so they are known to coexist.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")
# Where a CUDA toolkit or the pip CUDA wheels keep cuda_fp16.h / cuda_bf16.h, for an NVRTC that lacks them.
TOOLKIT_ROOTS = ("CUDA_PATH", "CUDA_HOME")
DEFAULT_TOOLKIT = Path("/usr/local/cuda")
# Builds quant_gemm.cu without <mma.h> (its CUDA-core product): the last resort when no header directory has it.
NO_TENSOR_CORES = "-DPS_NO_TENSOR_CORES"
WHEEL_INCLUDE_DIRS = ("nvidia/cu13/include", "nvidia/cuda_runtime/include", "nvidia/cuda_nvrtc/include")


def kernel_sources(kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    return sorted(kernel_dir.glob("*.cu"))


def module_source(kernel_dir: Path = KERNEL_DIR) -> str:
    """All kernel sources, local headers inlined once each (they are `#pragma once`)."""
    seen: set[Path] = set()
    parts = [_inline(path, kernel_dir, seen) for path in kernel_sources(kernel_dir)]
    return "".join(parts)


def _inline(path: Path, kernel_dir: Path, seen: set[Path]) -> str:
    out = [f"// ---- {path.name}\n"]
    for line in path.read_text().splitlines(keepends=True):
        match = LOCAL_INCLUDE.match(line)
        if match:
            header = (kernel_dir / match.group(1)).resolve()
            if not header.is_file():
                raise FileNotFoundError(f"{path.name} includes {match.group(1)}, not found in {kernel_dir}")
            if header not in seen:
                seen.add(header)
                out.append(_inline(header, kernel_dir, seen))
        elif not PRAGMA_ONCE.match(line):
            out.append(line)
    if not out[-1].endswith("\n"):
        out.append("\n")
    return "".join(out)


def nvrtc_options(include_dirs: Iterable[str] = (), defines: Iterable[str] = ()) -> tuple[str, ...]:
    return ("--std=c++17", f"-I{KERNEL_DIR}", *(f"-I{d}" for d in include_dirs), *defines)


def option_sets(include_dirs: list[str]) -> list[tuple[str, ...]]:
    """What NVRTC tries, in order: its own headers; a toolkit's or the wheels' (`include_dirs`); and, where
    neither has the tensor cores' <mma.h>, the same without the tensor-core GEMM (quant_gemm.cu on the CUDA
    cores), which tensor_cores() then reports."""
    sets = [nvrtc_options()]
    if include_dirs:
        sets.append(nvrtc_options(include_dirs))
    sets.append(nvrtc_options(include_dirs, (NO_TENSOR_CORES,)))
    return sets


def tensor_cores(options: Iterable[str]) -> bool:
    """Whether kernels built with `options` may use the tensor cores (on a GPU of sm_80 or later)."""
    return NO_TENSOR_CORES not in tuple(options)


def cuda_include_dirs(search_paths: Iterable[str] | None = None) -> list[str]:
    """Directories holding cuda_bf16.h: a toolkit named by CUDA_PATH / CUDA_HOME, /usr/local/cuda, or the
    pip CUDA wheels on sys.path. Only the first is returned, so two CUDA versions' headers never mix."""
    candidates = [Path(os.environ[v]) / "include" for v in TOOLKIT_ROOTS if os.environ.get(v)]
    candidates.append(DEFAULT_TOOLKIT / "include")
    for entry in search_paths if search_paths is not None else sys.path:
        candidates += [Path(entry) / d for d in WHEEL_INCLUDE_DIRS]
    for path in candidates:
        if (path / "cuda_bf16.h").is_file() and (path / "cuda_fp16.h").is_file():
            return [str(path)]
    return []
