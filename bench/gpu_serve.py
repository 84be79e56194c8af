"""gpu_check's e2e_serve section: `pagedserve serve` on random weights in SmolLM2's shape with its real tokenizer
(bench.synthetic_checkpoint), driven over HTTP by `pagedserve bench` at each stream count, one server for all.

Each count runs `streams` clients in a closed loop for 2 x streams requests (after `streams` unmeasured ones),
prompts of input_len random tokens, output_len tokens each (EOS ignored, so every request's length is known).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.experiments.server import Server
from bench.synthetic_checkpoint import write_smollm2_checkpoint


@dataclass(frozen=True)
class ServePlan:
    backend: str = "cupy"
    dtype: str = "bfloat16"  # cupy only
    num_layers: int = 30
    streams: tuple[int, ...] = (1, 16, 64, 256)
    input_len: int = 128
    output_len: int = 128
    bench_timeout_s: float = 120.0

    def server_args(self, model: Path) -> list[str]:
        dtype = ["--dtype", self.dtype] if self.backend == "cupy" else []
        return ["--backend", self.backend, "--model", str(model), *dtype, "--max-num-seqs", str(max(self.streams)),
                "--max-model-len", str(self.input_len + self.output_len + 16)]


def serve_and_bench(plan: ServePlan) -> dict[str, Any]:
    """Output tokens/s and TTFT / TPOT / ITL percentiles at each stream count."""
    with tempfile.TemporaryDirectory(prefix="pagedserve-e2e-") as tmp:
        model = write_smollm2_checkpoint(Path(tmp) / "smollm2-random", plan.num_layers)
        with Server(plan.server_args(model)) as server:
            runs = {str(n): _bench(server.url, plan, n, Path(tmp) / f"bench-{n}.json") for n in plan.streams}
    return {"backend": plan.backend, "layers": plan.num_layers, "input_len": plan.input_len,
            "output_len": plan.output_len, "streams": runs}


def _bench(url: str, plan: ServePlan, streams: int, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "service", "bench", "--base-url", url, "--concurrency", str(streams),
           "--num-requests", str(2 * streams), "--warmup", str(streams), "--input-len", str(plan.input_len),
           "--output-len", str(plan.output_len), "--ignore-eos", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=plan.bench_timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pagedserve bench at {streams} streams failed: {done.stderr[-2000:]}")
    s = json.loads(out.read_text())["points"][0]["summary"]
    if s["failed"]:
        raise RuntimeError(f"pagedserve bench at {streams} streams: {s['failed']} requests failed: {s['errors']}")
    return {"output_tokens_per_s": round(s["output_throughput"], 1), "completed": s["completed"],
            **{f"{m}_{p}_ms": round(s[f"{m}_ms"][p], 2) for m in ("ttft", "tpot", "itl") for p in ("p50", "p99")}}
