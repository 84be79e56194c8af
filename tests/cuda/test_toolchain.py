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
