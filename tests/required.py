"""Every skip in the suite goes through here (tests/test_suite_rules.py checks it).

`unavailable`: a tool a test needs is missing. The project's set-up installs every such tool, so under CI=true,
where every such check must run, the test fails; elsewhere it skips with the reason.
`hardware_absent`: the machine lacks hardware (a CUDA device, AMX tiles, AVX2) that no set-up can install and
that CI's machine may lack too, so the test skips everywhere."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(message: str, checks: str) -> NoReturn:
    """Fail (CI) or skip (elsewhere) the calling test; `checks` names what CI must run, for the failure."""
    if in_ci():
        pytest.fail(f"{message}; CI must run {checks}")
    pytest.skip(message)


def hardware_absent(message: str) -> NoReturn:
    """Skip the calling test, under CI too: the hardware it needs is not on this machine."""
    pytest.skip(message)
