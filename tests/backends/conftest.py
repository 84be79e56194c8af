"""Fixtures of the NumPy backend's C kernel tests."""

from __future__ import annotations

import pytest

from tests.backends.compiler import require_c_compiler
from tests.backends.haswell import has_avx2
from tests.required import hardware_absent


@pytest.fixture(scope="session")
def c_compiler() -> str:
    """Session scope: checked before any module's fixture builds the kernels."""
    return require_c_compiler()


@pytest.fixture(scope="session")
def avx2() -> None:
    """A skip, under CI too, where the CPU cannot run an AVX2 build: CI's machine may lack AVX2."""
    if not has_avx2():
        hardware_absent("the CPU cannot run an AVX2 build")
