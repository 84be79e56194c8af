"""bench/gpu_check.py without a GPU: argument parsing, the peak-bandwidth and byte arithmetic, and that a
failing section is recorded while the rest still run. (Its measurement sections are dry-run on the emulated
device by the `gpu-check-dry-run` scenario.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_check


def test_arguments() -> None:
    args = gpu_check.parse_args(["--out", "x.json"])
    assert (args.out, args.budget_s, args.dtype, args.skip_tests) == (Path("x.json"), 280.0, "bfloat16", False)
    assert gpu_check.parse_args(["--out", "y", "--dtype", "float16", "--skip-tests"]).skip_tests
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])


def test_peak_bandwidth() -> None:
    # H200: HBM3e at 3201 MHz over 6144 bits, about 4.9 TB/s.
    assert gpu_check.peak_from_attributes(3_201_000, 6144) == pytest.approx(4.916736e12)  # 3.201e9 * 2 * 768 B
    assert gpu_check.peak_from_table("NVIDIA H200") == 4.8e12
    assert gpu_check.peak_from_table("NVIDIA H100 PCIe") == 2.0e12
    assert gpu_check.peak_from_table("NVIDIA H100 80GB HBM3") == 3.35e12
    assert gpu_check.peak_from_table("NVIDIA A100-SXM4-80GB") == 2.039e12
    assert gpu_check.peak_from_table("Tesla T4") is None
    assert gpu_check.choose_peak(4.9e12, 4.8e12) == (4.9e12, "device attributes")
    assert gpu_check.choose_peak(0.0, 4.8e12) == (4.8e12, "datasheet table")
    assert gpu_check.choose_peak(None, None) == (None, "unknown")


def test_decode_bytes_count_each_kv_row_once() -> None:
    # 64 sequences x 4096 tokens x 3 kv heads x 64 dims x 2 bytes, for K and V: about 201 MB.
    kv = 64 * 4096 * 3 * 64 * 2 * 2
    total = gpu_check.decode_bytes([4096] * 64, 9, 3, 64, 2, 16)
    assert kv < total < kv * 1.01


def _ok(ctx: gpu_check.Context) -> dict[str, Any]:
    return {"summary": "fine"}


def _boom(ctx: gpu_check.Context) -> dict[str, Any]:
    raise RuntimeError("kernel launch failed")


def test_a_failing_section_does_not_stop_the_rest() -> None:
    sections = (("a", _boom, 0.0), ("b", _ok, 0.0), ("c", _ok, 1e9))
    report = gpu_check.run(gpu_check.Context(plan=gpu_check.Plan()), sections, budget_s=60.0)
    assert [s["status"] for s in report.sections.values()] == ["error", "ok", "no-time"]
    assert "kernel launch failed" in report.sections["a"]["error"] and not report.ok


def test_main_writes_json_and_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r" / "gpu.json"
    monkeypatch.setattr(gpu_check, "SECTIONS", (("environment", _ok, 0.0), ("gpu_tests", _boom, 0.0)))
    assert gpu_check.main(["--out", str(out), "--skip-tests"]) == 0  # the failing section was skipped
    result = json.loads(out.read_text())
    assert result["ok"] and result["sections"]["gpu_tests"]["status"] == "skipped"
    assert gpu_check.main(["--out", str(out)]) == 1
    assert json.loads(out.read_text())["sections"]["gpu_tests"]["status"] == "error"


def test_e2e_serve_serves_the_random_checkpoint_over_http() -> None:
    """The e2e_serve section's whole path on the CPU: the random SmolLM2-shaped checkpoint (2 layers) served by
    `pagedserve serve --backend numpy`, `pagedserve bench` at 1 and 3 streams, and the comparison at 64 streams
    with an engine-alone rate (given here, as e2e_decode would)."""
    plan = gpu_check.Plan(num_layers=2, serve_backend="numpy", serve_streams=(1, 3, 64), serve_input_len=16,
                          serve_output_len=8)
    ctx = gpu_check.Context(plan=plan, env={"engine_tokens_per_s": {"64": 1e9}})
    info = gpu_check.e2e_serve(ctx)
    assert set(info["streams"]) == {"1", "3", "64"} and info["layers"] == 2
    for streams, run in info["streams"].items():
        assert run["completed"] == 2 * int(streams) and run["output_tokens_per_s"] > 0
        assert 0 < run["tpot_p50_ms"] <= run["tpot_p99_ms"] and run["ttft_p50_ms"] > 0
    assert info["served_over_engine_at_64"] < 0.01 and info["target_met"] is False
