"""The `pagedserve` command in-process: generate prints only the text; load errors are one line, exit 2; a
usage error shows the usage of the command that was run; serve's help explains every flag."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from backends.numpy_backend.native.cpu_tiers import ARM, CpuInfo
from service.cli.commands import commands, main
from service.config.setting_docs import doc_of
from service.config.settings import all_settings
from service.config.settings_table import default_text
from tests.gemma3 import gemma3_path


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


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_cpu_tier_this_cpu_cannot_run_exits_2(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Refused before any kernel is built, in one line that says what the CPU can run instead."""
    host = CpuInfo.of_this_host()
    foreign = "avx2" if host.machine == ARM else "neon"
    extra = ["--prompt", "x"] if command == "generate" else ["--port", "0"]
    code, _, err = run(capsys, command, "--cpu-isa", foreign, *extra)
    assert code == 2
    assert_one_line_error(err, f"cpu_isa {foreign} is for ")
    assert f"it can run: {', '.join(tier.name for tier in host.runnable())}" in err


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_draft_model_with_another_tokenizer_is_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                     command: str) -> None:
    extra = ["--prompt", "x"] if command == "generate" else ["--port", "0"]
    code, _, err = run(capsys, command, "--speculative-method", "draft", "--draft-model", str(gemma3_path()),
                       *extra)
    assert code == 2
    said = "\n".join(line for line in err.splitlines() if not line.startswith("pagedserve listening"))  # serve's
    assert_one_line_error(said, "speculative.draft_model", "its tokenizer has 262144 tokens, the served model's 49152")


def test_the_draft_method_without_a_draft_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "generate", "--speculative-method", "draft", "--prompt", "x")
    assert code == 2
    assert_one_line_error(err, "speculative_method draft takes its model from draft_model")


def test_subcommands_are_registered_in_one_place() -> None:
    assert [c.name for c in commands()][:2] == ["serve", "generate"]


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert not out
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--bogus"], "unrecognized arguments: --bogus"),
    (["serve", "--max-num-seqs", "lots"], "argument --max-num-seqs: expected an integer, got 'lots'"),
    (["serve", "--kv-layout", "sideways"], "argument --kv-layout: expected one of paged, contiguous, got 'sideways'"),
    (["serve", "--preset", "fastest"], "argument --preset: expected one of latency, throughput, got 'fastest'"),
    (["generate", "--prompt", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["generate"], "the following arguments are required: --prompt"),
])
def test_usage_errors_show_the_commands_usage(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              message: str) -> None:
    err = usage_error(capsys, *argv)
    assert err.startswith(f"usage: pagedserve {argv[0]} ") and f"pagedserve {argv[0]}: error: {message}" in err


def test_an_unknown_command_shows_the_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "serf", "--port", "0")
    assert err.startswith("usage: pagedserve ") and "invalid choice: 'serf'" in err


def test_top_level_help_names_every_command(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # no help text wrapped
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in commands():
        assert cmd.name in out and cmd.help in out


def help_entries(text: str) -> dict[str, str]:
    """Each option of a --help text, by its first flag: its usage and help joined on one line."""
    entries: dict[str, str] = {}
    flag = ""
    for line in text.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line.strip()
        elif flag and line.startswith("   "):
            entries[flag] += " " + line.strip()
        else:
            flag = ""
    return entries


def test_serve_help_explains_every_flag(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # no help text wrapped
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    for s in all_settings():
        entry, doc = entries[s.flag], doc_of(s)
        assert doc.text in entry and f"[default: {default_text(s)}]" in entry, entry
        if doc.choices:
            assert "{" + ",".join(doc.choices) in entry, entry
    assert entries["--preset"].startswith("--preset {latency,throughput,none} ")
    assert entries["--port"].startswith("--port INT ") and "[default: 8000]" in entries["--port"]
    assert entries["--log-prompts"].startswith("--log-prompts, --no-log-prompts ")
    assert "[default: false]" in entries["--log-prompts"]
