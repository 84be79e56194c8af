"""Fixtures of the NumPy backend's C kernel tests."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.numpy_backend.native.build import default_cache_dir
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.matmul import NativeMatmul
from tests.backends.compiler import require_c_compiler
from tests.backends.tiers import RUNNABLE, tier_id
from tests.required import hardware_absent


@pytest.fixture(scope="session")
def c_compiler() -> str:
    """Session scope: checked before any module's fixture builds the kernels."""
    return require_c_compiler()


@pytest.fixture(scope="session")
def avx2() -> None:
    """A skip, under CI too, where the CPU cannot run an AVX2 build: CI's machine may lack AVX2."""
    if "avx2" not in {tier.name for tier in RUNNABLE}:
        hardware_absent("the CPU cannot run an AVX2 build")


@pytest.fixture(scope="session", params=RUNNABLE, ids=tier_id)
def tier(request: pytest.FixtureRequest) -> CpuTier:
    """Each CPU tier this host can run, in turn: a kernel test that takes it runs once per tier."""
    tier: CpuTier = request.param
    return tier


@pytest.fixture(scope="session")
def kernel_cache(c_compiler: str) -> Path:
    """The kernels' own build cache (build.py: keyed by a hash of the source and its headers, the flags, the
    compiler and the CPU), as the backend uses it: each source is compiled once per tier and version, not once
    per session. The tests of the cache itself build into their own directories."""
    return default_cache_dir()


@pytest.fixture(scope="session")
def matmul_for(kernel_cache: Path) -> Callable[[CpuTier, bool], NativeMatmul]:
    """(tier, fast) -> the projections built for that tier, bound once a session: function-scoped fixtures take
    them from here, so a test parametrized over some tiers only gets its own tier's build."""
    return functools.cache(lambda tier, fast: NativeMatmul(cache_dir=kernel_cache, fast=fast, tier=tier))
