"""The `pagedserve` command in-process: generate prints only the text; load errors are one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from service.cli import commands, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0]


def test_generate_prints_only_the_completion(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "generate", "--backend", "sim", "--prompt", "Hello", "--max-tokens", "6",
                         "--num-blocks", "64")
    assert code == 0 and out.endswith("\n") and out.strip() and "\n" not in out.rstrip("\n")
    again = run(capsys, "generate", "--backend", "sim", "--prompt", "Hello", "--max-tokens", "6", "--chat")
    assert again[0] == 0 and again[1].strip()


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_missing_model_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str) -> None:
    missing = tmp_path / "absent.gguf"
    extra = ["--prompt", "x"] if command == "generate" else ["--port", "0"]
    code, _, err = run(capsys, command, "--backend", "sim", "--model", str(missing), *extra)
    assert code == 2
    assert_one_line_error(err, "not found", str(missing))


def test_not_a_gguf_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a model" * 4)
    code, _, err = run(capsys, "generate", "--model", str(junk), "--prompt", "x")
    assert code == 2
    assert_one_line_error(err, "not a GGUF file")


def test_unsupported_architecture(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), arch="bert")
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, _, err = run(capsys, "generate", "--model", str(path), "--prompt", "x")
    assert code == 2
    assert_one_line_error(err, "unsupported architecture 'bert'")


def test_config_errors_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_NO_SUCH_SETTING", "1")
    code, _, err = run(capsys, "generate", "--prompt", "x")
    assert code == 2
    assert_one_line_error(err, "PAGEDSERVE_NO_SUCH_SETTING")


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_unknown_backend_exits_2(capsys: pytest.CaptureFixture[str], command: str) -> None:
    extra = ["--prompt", "x"] if command == "generate" else ["--port", "0"]
    code, _, err = run(capsys, command, "--backend", "abacus", *extra)
    assert code == 2
    assert_one_line_error(err, "unknown backend 'abacus'")


def test_subcommands_are_registered_in_one_place() -> None:
    assert [c.name for c in commands()][:2] == ["serve", "generate"]
