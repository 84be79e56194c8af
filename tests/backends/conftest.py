"""Fixtures of the NumPy backend's C kernel tests."""

from __future__ import annotations

import pytest

from tests.backends.compiler import require_c_compiler


@pytest.fixture(scope="session")
def c_compiler() -> str:
    """Session scope: checked before any module's fixture builds the kernels."""
    return require_c_compiler()
