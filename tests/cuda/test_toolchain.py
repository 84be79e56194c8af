"""A missing compiler fails the CUDA checks under CI=true and skips them elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cuda import toolchain


def test_missing_tool_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "find", lambda tool: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="nvcc not found"):
        toolchain.require("nvcc")


def test_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "find", lambda tool: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run"):
        toolchain.require("g++")


def test_emulation_build_writes_only_to_its_output_dir(tmp_path: Path) -> None:
    cmd, lib = toolchain.emu_build_command("g++", tmp_path, "thread")
    assert lib.parent == tmp_path and "-fsanitize=thread" in cmd


def fake_compiler(tmp_path: Path) -> str:
    """A compiler that writes its -o file and warns, without compiling anything."""
    path = tmp_path / "fake-compiler"
    path.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "fake 1"; exit 0; }\n'
                    'for arg; do out="$arg"; done; echo library > "$out"; echo "warning: unused"\n')
    path.chmod(0o755)
    return str(path)


def test_an_emulation_build_is_reused_only_for_the_same_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second build of the same includes, flags and compiler is the cached library, with the first build's
    output (its warnings); other flags build again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gxx = fake_compiler(tmp_path)
    first = toolchain.start_emu_build(gxx, tmp_path / "a", "")
    assert first.proc is not None and first.wait(timeout=60) == (0, "warning: unused\n")
    again = toolchain.start_emu_build(gxx, tmp_path / "b", "")
    assert again.proc is None and again.lib.parent == toolchain.emu_cache_dir()
    assert again.wait(timeout=60) == (0, "warning: unused\n") and again.lib.read_text() == "library\n"
    other = toolchain.start_emu_build(gxx, tmp_path / "c", "thread")
    assert other.proc is not None and other.wait(timeout=60)[0] == 0


def test_a_cubin_is_reused_only_for_the_same_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    nvcc, source = fake_compiler(tmp_path), toolchain.kernel_sources()[0]
    for out in ("a", "b", "c"):
        (tmp_path / out).mkdir()
    first, cubin = toolchain.cached_nvcc(nvcc, source, "sm_80", tmp_path / "a")
    assert first.returncode == 0 and cubin.parent == tmp_path / "a"
    again, cached = toolchain.cached_nvcc(nvcc, source, "sm_80", tmp_path / "b")
    assert cached.parent == toolchain.cache_dir("cubins") and cached.read_text() == "library\n"
    assert (again.returncode, again.stdout + again.stderr) == (0, first.stdout + first.stderr) != (0, "")
    _, other = toolchain.cached_nvcc(nvcc, source, "sm_90", tmp_path / "c")
    assert other.parent == tmp_path / "c"
