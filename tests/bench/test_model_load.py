"""bench.model_load measures a load in a fresh process: its time, the memory it adds and the weights it holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.model_load import main, measure
from tests.backends.test_hf_checkpoint import tiny_checkpoint


def test_a_tiny_checkpoints_load_is_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tiny_checkpoint(tmp_path / "tiny")
    sample = measure(str(directory), "float32")
    # 2 layers of hidden 64 and a 49,152-row embedding, float32: what the loaded model holds
    embedding, layer = 49152 * 64, 2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64
    assert sample["weights"] == 4 * (embedding + 64 + 2 * layer)
    assert sample["rss"] >= sample["weights"] and 0 < sample["seconds"] < 60
    main(["--model", str(directory), "--repeats", "1"])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith(f"| {directory} |") and row.count("|") == 6
