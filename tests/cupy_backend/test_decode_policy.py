"""The decode kernels' policy: the built-in rule without a table, the nearest measured point with one, and the
table made from a GPU run's sweep (bench/decode_policy.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from backends.cupy_backend import launch
from backends.cupy_backend.decode_policy import DecodePolicy, Point, load_policy
from backends.cupy_backend.ops import Kernels
from backends.cupy_backend.storage import storage_for
from backends.cupy_backend.synthetic import SMOLLM2
from bench import decode_policy

PART = launch.DEFAULT_PARTITION_SIZE


def test_without_a_table_the_rule_decides() -> None:
    policy = load_policy(Path("/nonexistent/decode_policy.json"))
    assert policy == DecodePolicy() and "rule" in policy.describe()
    for span, seqs, heads in itertools.product((1, 512, 513, 4096, 9000, 20000), (1, 16, 64, 256), (4, 9, 32)):
        want = launch.use_partitioned_decode(span, seqs, heads, PART)
        assert policy.partitioned(span, seqs, heads, 64, PART, "bfloat16") == want, (span, seqs, heads)


def _table() -> DecodePolicy:
    """Partitioned wins for few blocks over long spans at head_dim 64; never at head_dim 128."""
    points = [Point(blocks, span, 64, blocks <= 64 and span >= 2048)
              for blocks in (9, 144, 576, 2304) for span in (512, 2048, 8192)]
    points += [Point(32, 8192, 128, False)]
    return DecodePolicy(tuple(points), "a test GPU", "bfloat16", PART)


def test_a_table_picks_the_winner_at_the_nearest_point() -> None:
    def split(span: int, seqs: int, heads: int, head_dim: int) -> bool:
        return _table().partitioned(span, seqs, heads, head_dim, PART, "bfloat16")

    assert split(4096, 1, 9, 64)  # nearest: 9 blocks x 2048 or 8192, partitioned
    assert not split(4096, 64, 9, 64)  # 576 blocks: plain
    assert not split(600, 1, 9, 64)  # nearest span 512: plain
    assert not split(8192, 1, 32, 128)  # head_dim 128's own point
    assert split(8192, 1, 9, 256)  # no head_dim 256 point: all of them count
    assert not split(PART, 1, 9, 64)  # one partition is the plain kernel's work


def test_the_rule_decides_where_the_table_does_not_speak() -> None:
    """16 sequences x 9 heads: the table's nearest points say plain, the rule (144 blocks) partitioned."""
    table = _table()
    assert not table.partitioned(4096, 16, 9, 64, PART, "bfloat16")
    assert table.partitioned(20000, 16, 9, 64, PART, "bfloat16")  # past the longest measured span
    assert table.partitioned(4096, 16, 9, 64, PART, "float16")  # measured in another dtype
    assert table.partitioned(4096, 16, 9, 64, 256, "bfloat16")  # with other partitions


def test_a_table_survives_json_and_refuses_empty_points(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(_table().to_json()))
    assert load_policy(path) == _table() and "measured on a test GPU" in load_policy(path).describe()
    with pytest.raises(ValueError, match="at least one block"):
        DecodePolicy.from_json({"points": [{"blocks": 0, "span": 4, "head_dim": 64, "partitioned": True}]})


def test_kernels_ask_the_policy_unless_a_benchmark_forces_a_kernel() -> None:
    step = SimpleNamespace(max_context_len=4096, num_seqs=1)
    only_plain = DecodePolicy((Point(9, 1024, 64, False), Point(9, 8192, 64, False)), "x", "float32", PART)
    kernels = Kernels(np, None, storage_for("float32"), policy=only_plain)  # type: ignore[arg-type]
    assert not kernels.partitioned(step, SMOLLM2)  # type: ignore[arg-type]
    assert Kernels(np, None, storage_for("float32")).partitioned(step, SMOLLM2)  # type: ignore[arg-type]
    forced = Kernels(np, None, storage_for("float32"), split_decode=True, policy=only_plain)  # type: ignore[arg-type]
    assert forced.partitioned(step, SMOLLM2)  # type: ignore[arg-type]


def _run(points: list[dict[str, Any]], status: str = "ok") -> dict[str, Any]:
    sweep = {"status": status, "device": "NVIDIA H200", "dtype": "bfloat16", "partition_size": PART,
             "points": points}
    return {"ok": status == "ok", "sections": {"decode_sweep": sweep}}


def test_the_table_comes_from_a_runs_sweep(tmp_path: Path) -> None:
    points = [{"batch": 1, "heads": 9, "context": 4096, "head_dim": 64, "partitioned_wins": True},
              {"batch": 64, "heads": 9, "context": 4096, "head_dim": 64, "partitioned_wins": False}]
    run, out = tmp_path / "2026-12-10-h200-gpu_check.json", tmp_path / "policy.json"
    run.write_text(json.dumps(_run(points)))
    assert decode_policy.main([str(run), "--out", str(out)]) == 0
    policy = load_policy(out)
    assert policy.points == (Point(9, 4096, 64, True), Point(576, 4096, 64, False))
    assert policy.measured_on == "NVIDIA H200 (2026-12-10-h200-gpu_check.json)"
    assert (policy.dtype, policy.partition_size) == ("bfloat16", PART)
    with pytest.raises(ValueError, match="no passing decode_sweep"):
        decode_policy.policy_from_run(_run(points, status="error"), "bad.json")
