"""`pagedserve bench`: its own options only, usage errors with its own usage, and a sweep against a live sim
server that writes JSON and a PNG."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.model.loader import open_model
from bench.bench_cmd import LazyTokenCounter
from bench.loadgen.args import shapes_of, workload_of
from bench.loadgen.cli import build_parser
from bench.loadgen.sweep import parse_sweep
from bench.loadgen.workloads import ChatWorkload, FileWorkload, SharedPrefixWorkload
from service.cli.commands import main
from service.config.settings import ServiceConfig
from tests.required import unavailable
from tests.service.live import LiveServer, cached_builder, sim_config


def parse(*argv: str) -> object:
    return build_parser().parse_args(argv)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = LiveServer.start(sim_config(ServiceConfig(port=0)), cached_builder(open_model()[1]))
    yield live
    live.close()


def test_load_shapes_from_options() -> None:
    assert [s.concurrency for s in shapes_of(parse(), None)] == [16]  # type: ignore[arg-type]
    args = parse("--rate", "5", "--burstiness", "0.5", "--concurrency", "8")
    (shape,) = shapes_of(args, None)  # type: ignore[arg-type]
    assert (shape.rate, shape.burstiness, shape.concurrency) == (5.0, 0.5, 8)
    sweep = parse_sweep("rate=1,2.5,inf")
    assert [s.rate for s in shapes_of(parse(), sweep)] == [1.0, 2.5, math.inf]  # type: ignore[arg-type]
    sweep = parse_sweep("concurrency=1,4")
    assert [(s.concurrency, s.rate) for s in shapes_of(parse("--rate", "3"), sweep)] == [  # type: ignore[arg-type]
        (1, None), (4, None)]
    for bad in ("concurrency=1.5", "speed=1", "rate=", "rate=0", "concurrency=x"):
        with pytest.raises(ValueError):
            parse_sweep(bad)


def test_workloads_from_options(tmp_path: Path) -> None:
    assert isinstance(workload_of(parse("--workload", "chat", "--turns", "2")), ChatWorkload)  # type: ignore[arg-type]
    shared = workload_of(parse("--workload", "shared-prefix"))  # type: ignore[arg-type]
    assert isinstance(shared, SharedPrefixWorkload) and shared.prefix_len == 1024
    with pytest.raises(ValueError, match="--dataset"):
        workload_of(parse("--workload", "file"))  # type: ignore[arg-type]
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    assert isinstance(workload_of(parse("--workload", "file", "--dataset", str(data))), FileWorkload)  # type: ignore[arg-type]


def test_bad_options_exit_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "bench", "--sweep", "nonsense", "--no-progress")
    assert err.startswith("usage: pagedserve bench ") and "pagedserve bench: error: bad sweep" in err


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--backend", "--kv-cache-memory"])
def test_server_settings_are_not_bench_flags(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    err = usage_error(capsys, "bench", flag, "4")
    assert err.startswith("usage: pagedserve bench ") and f"unrecognized arguments: {flag} 4" in err


def test_help_lists_only_the_bench_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: pagedserve bench ")
    for flag in ("--base-url", "--host", "--port", "--api-key", "--served-model-name", "--model", "--sweep"):
        assert flag in out
    assert "--max-num-seqs" not in out and "--config" not in out and "ignored" not in out


def test_the_load_generator_alone_has_no_model_option() -> None:
    assert "--model" not in build_parser().format_help()
    args = parse("--host", "localhost", "--port", "9000", "--api-key", "k", "--served-model-name", "m")
    assert (args.host, args.port, args.api_key, args.served_model_name) == (  # type: ignore[attr-defined]
        "localhost", 9000, "k", "m")


def test_pagedserve_bench_counts_with_the_models_tokenizer() -> None:
    text = "The capital of France is Paris."
    assert LazyTokenCounter(None)(text) == len(open_model()[1].tokenizer.encode(text)) > 1


def test_sweep_writes_json_and_plot(server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    code = main(["bench", "--base-url", server.url, "--sweep", "concurrency=1,3", "--num-requests", "6",
                 "--input-len", "8", "--output-len", "4", "--lengths", "lognormal", "--slo", "ttft=2s,tpot=1s",
                 "--out", str(out), "--save-requests", "--check-metrics", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Output token throughput" in captured.out and "cross-check" in captured.out
    data = json.loads(out.read_text())
    assert data["target"]["model"] == "SmolLM2-135M-Instruct"  # from /v1/models
    assert [p["label"] for p in data["points"]] == ["concurrency=1", "concurrency=3"]
    for point in data["points"]:
        summary = point["summary"]
        assert summary["completed"] == 6 and summary["good_requests"] == 6 and len(point["requests"]) == 6
        assert set(summary["ttft_ms"]) >= {"mean", "std", "p50", "p90", "p95", "p99"}
    if importlib.util.find_spec("matplotlib") is None:
        unavailable("no matplotlib (in the dev extra)", "the sweep's plot check")
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
