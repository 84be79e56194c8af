"""bench.against_llama_server: its bench runs' arguments are the load generator's, and its figures and target
verdicts come out right on canned runs (the servers themselves are run by hand: docs/PERFORMANCE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.against_llama_server import BENCH, LLAMA, SINGLE, LlamaServer, Pooled, ServerError, bench_args, report
from bench.loadgen.cli import build_parser


def point(ttfts: list[float], tpot: float, itl: float, duration_s: float, output: int = 128) -> dict[str, Any]:
    requests = [{"ttft": t, "tpot": tpot, "e2e": t + tpot * (output - 1), "itls": [itl] * (output - 1),
                 "prompt_tokens": 140, "output_tokens": output, "token_source": "usage"} for t in ttfts]
    return {"summary": {"duration_s": duration_s, "output_tokens": output * len(ttfts), "failed": 0},
            "requests": requests}


def test_the_bench_arguments_parse_as_pagedserve_bench_reads_them() -> None:
    args = bench_args("http://127.0.0.1:9", "m", "model.gguf", concurrency=16, requests=24, input_len=256,
                      output_len=128, seed=1, warmup=0, out="run.json")
    parsed = build_parser(model_option=True).parse_args(args)
    assert (parsed.base_url, parsed.served_model_name, parsed.concurrency, parsed.num_requests) == \
        ("http://127.0.0.1:9", "m", 16, 24)
    assert (parsed.input_len, parsed.output_len, parsed.seed, parsed.ignore_eos, parsed.save_requests) == \
        (256, 128, 1, True, True)


def test_the_bench_runs_as_pagedserve_bench() -> None:
    done = subprocess.run([sys.executable, *BENCH, "--help"], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: pagedserve bench")


def test_runs_pool_over_rounds_and_the_targets_are_judged() -> None:
    pooled: dict[str, dict[str, Pooled]] = {SINGLE: {}, "16 streams": {}}
    for _ in range(2):  # two rounds
        pooled[SINGLE].setdefault("pagedserve exact", Pooled()).add_run(point([0.05, 0.06], 0.012, 0.012, 3.0))
        pooled[SINGLE].setdefault("pagedserve fast", Pooled()).add_run(point([0.05, 0.05], 0.009, 0.009, 2.5))
        pooled[SINGLE].setdefault(LLAMA, Pooled()).add_run(point([0.04, 0.04], 0.010, 0.010, 2.6))
        pooled["16 streams"].setdefault("pagedserve exact", Pooled()).add_run(point([0.5] * 16, 0.05, 0.2, 8.0))
        pooled["16 streams"].setdefault(LLAMA, Pooled()).add_run(point([0.9] * 16, 0.08, 0.08, 16.0))
    pooled[SINGLE][LLAMA].add_run({"summary": {"duration_s": 0.0, "output_tokens": 0, "failed": 1,
                                               "errors": {"ClientOSError": 1}}, "requests": []})
    assert pooled[SINGLE][LLAMA].errors == {"ClientOSError": 1}
    exact = pooled["16 streams"]["pagedserve exact"]
    assert exact.output_tokens == 2 * 16 * 128 and exact.duration_s == 16.0 and len(exact.itl) == 2 * 16 * 127
    figures = {load: {name: p.figures() for name, p in s.items()} for load, s in pooled.items()}
    assert figures["16 streams"]["pagedserve exact"]["output_tok_s"] == 4096 / 16
    assert figures[SINGLE][LLAMA]["ttft_p50_ms"] == 40.0
    lines = report(figures, 16)
    assert lines[2] == ("| 1 stream | pagedserve exact | 4 | 140 | 85.3 | 50.0 | 60.0 | 12.00 | 12.00 | 12.0 |")
    verdicts = lines[lines.index("") + 1:]
    assert verdicts == [
        "1 stream, TPOT p50 fast / llama-server: 0.90x (target at most 1x): met",
        "1 stream, TPOT p50 exact / llama-server: 1.20x (target at most 1.5x): met",
        "16 streams, output tok/s pagedserve exact / llama-server: 2.00x (target at least 2x): met",
        "16 streams, pagedserve exact ITL p99 / TPOT p50: 4.00x (target at most 2.5x): NOT met",
    ]


def test_a_llama_server_that_exits_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    """A binary built for instructions the CPU refuses dies at load (SIGILL): the error carries its log, read
    before the temporary log file is removed (it had been read after, and the report was a FileNotFoundError)."""
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'load_model: loading model'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ServerError, match=r"(?s)exited \(3\).*load_model: loading model"):
        LlamaServer(str(fake), "model.gguf", threads=2, parallel=1, ctx=64).__enter__()
