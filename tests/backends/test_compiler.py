"""A missing C compiler fails the C kernel tests under CI=true and skips them elsewhere."""

from __future__ import annotations

import pytest

from tests.backends.compiler import require_c_compiler


def test_missing_compiler_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler -O2")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="'no-such-compiler -O2' not found"):
        require_c_compiler()


def test_missing_compiler_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the NumPy backend's C kernel tests"):
        require_c_compiler()


def test_the_compiler_is_what_the_build_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "sh -c")  # any program on PATH: its first word is looked up
    assert require_c_compiler().endswith("/sh")
