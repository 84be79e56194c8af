"""A tool a test needs is missing: under CI=true, where every such check must run, the test fails; elsewhere it
skips with the reason."""

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
