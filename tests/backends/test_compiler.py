"""A missing C compiler fails the C kernel tests under CI=true and skips them elsewhere; a compile a test
requires to pass is repeated only when one of its inputs changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.compiler import checked_cache_dir, require_c_compiler, start_checked_compile


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


def stand_in_compiler(tmp_path: Path, status: int = 0) -> str:
    """Writes its -o file and a warning, counting its runs in `runs`; exits with `status`."""
    path = tmp_path / "stand-in-cc"
    path.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "stand-in 1"; exit 0; }\n'
                    f'echo run >> {tmp_path / "runs"}\n'
                    'while [ "$1" != -o ]; do shift; done; echo library > "$2"; echo "note: built" >&2\n'
                    f'exit {status}\n')
    path.chmod(0o755)
    return str(path)


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines()) if (tmp_path / "runs").exists() else 0


def test_a_passed_compile_is_reused_only_for_the_same_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second build of the same source, arguments and compiler is the first's output with its messages, and
    runs nothing; other arguments or another source compile again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc, source = stand_in_compiler(tmp_path), tmp_path / "a.c"
    source.write_text("int a;\n")
    first = start_checked_compile(cc, ["-Werror"], [source], tmp_path / "a.so")
    assert first.proc is not None and first.wait() == (0, "note: built\n") and runs(tmp_path) == 1
    again = start_checked_compile(cc, ["-Werror"], [source], tmp_path / "b.so")
    assert again.proc is None and again.output.parent == checked_cache_dir()
    assert again.wait() == (0, "note: built\n") and again.output.read_text() == "library\n" and runs(tmp_path) == 1
    assert start_checked_compile(cc, ["-Werror", "-O1"], [source], tmp_path / "c.so").wait()[0] == 0
    source.write_text("int b;\n")
    assert start_checked_compile(cc, ["-Werror"], [source], tmp_path / "d.so").wait()[0] == 0
    assert runs(tmp_path) == 3


def test_a_failed_compile_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc, source = stand_in_compiler(tmp_path, status=1), tmp_path / "a.c"
    source.write_text("int a;\n")
    for _ in range(2):
        assert start_checked_compile(cc, [], [source], tmp_path / "a.so").wait() == (1, "note: built\n")
    assert runs(tmp_path) == 2 and not checked_cache_dir().exists()
