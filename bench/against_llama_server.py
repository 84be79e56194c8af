"""pagedserve against llama.cpp's llama-server on the same GGUF file and host, interleaved A/B in one run:

    python -m bench.against_llama_server --llama-server PATH [--model GGUF] [--rounds 2]

Starts `pagedserve serve` twice on the NumPy backend (`--cpu-precision exact` and `fast`, the weights as
stored) and one `llama-server -t 2 -tb 2 -np 16 -c 16384`, all on 127.0.0.1 and up for the whole run, with two
threads each (pagedserve: OMP_NUM_THREADS=2). Each round drives every server in turn with `pagedserve bench`
(streamed /v1/completions, `--ignore-eos`, random prompts seeded by the round, so every server gets the same
prompts in a round and none of them a prompt it has cached): first one stream (`--single-requests` per round,
prompts of 128 words asking for 128 tokens), then `--streams` closed-loop clients (`--multi-requests` per
round, 256-word prompts, 128 tokens). The servers' order turns round about (A B C, then C B A), so a host that
speeds up or slows down moves all alike. The first round starts each server with one unmeasured request.
llama-server closes the connection after each streamed response without saying so; `pagedserve bench` sends a
request that met such a closed pooled connection again on a new one (bench/loadgen/client.py).

Prints one table over all rounds (percentiles over every request of every round; throughput = output tokens /
the runs' wall time), the ratios against llama-server that issue 29's targets name, the 1-minute load average
before and after, and each server's resident memory at the end. `--json FILE` also writes the pooled figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.experiments.server import Server, ServerError
from bench.host import free_port, load_average, rss_mib
from bench.stats import pct

LLAMA = "llama-server"
SINGLE, MULTI = "1 stream", "streams"
START_TIMEOUT_S = 120.0
BENCH = ("-m", "service", "bench")  # `pagedserve bench`, by the interpreter running this


@dataclass
class Pooled:
    """Every measured request of one server under one load, over all rounds (seconds)."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0
    duration_s: float = 0.0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # kind -> count

    def add_run(self, point: dict[str, Any]) -> None:
        """One `pagedserve bench --save-requests --out` point."""
        summary = point["summary"]
        self.duration_s += summary["duration_s"]
        self.output_tokens += summary["output_tokens"]
        self.failed += summary["failed"]
        for kind, count in summary.get("errors", {}).items():
            self.errors[kind] = self.errors.get(kind, 0) + count
        for r in point["requests"]:
            if r["ttft"] is not None:
                self.ttft.append(r["ttft"])
            if r["tpot"] is not None:
                self.tpot.append(r["tpot"])
            self.itl.extend(r["itls"])
            self.prompt_tokens.append(r["prompt_tokens"])

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0

    def figures(self) -> dict[str, float]:
        """Throughput (tokens/s) and latencies (ms)."""
        ms = 1e3
        return {"requests": len(self.tpot), "failed": self.failed,
                "prompt_tokens_mean": sum(self.prompt_tokens) / max(1, len(self.prompt_tokens)),
                "output_tok_s": self.throughput,
                "ttft_p50_ms": pct(self.ttft, .5) * ms, "ttft_p99_ms": pct(self.ttft, .99) * ms,
                "tpot_p50_ms": pct(self.tpot, .5) * ms, "tpot_p90_ms": pct(self.tpot, .9) * ms,
                "itl_p50_ms": pct(self.itl, .5) * ms, "itl_p99_ms": pct(self.itl, .99) * ms}


def report(figures: dict[str, dict[str, dict[str, float]]], streams: int) -> list[str]:
    """A markdown table (load -> server -> figures) and the issue's targets, met or not."""
    lines = ["| load | server | requests | prompt tokens | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
             "| TPOT p90 ms | ITL p99 ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for load, servers in figures.items():
        for name, f in servers.items():
            failed = f" ({f['failed']:.0f} failed)" if f["failed"] else ""
            lines.append(f"| {load} | {name} | {f['requests']:.0f}{failed} | {f['prompt_tokens_mean']:.0f} "
                         f"| {f['output_tok_s']:.1f} | {f['ttft_p50_ms']:.1f} | {f['ttft_p99_ms']:.1f} "
                         f"| {f['tpot_p50_ms']:.2f} | {f['tpot_p90_ms']:.2f} | {f['itl_p99_ms']:.1f} |")
    lines.append("")
    lines.extend(targets(figures, streams))
    return lines


def targets(figures: dict[str, dict[str, dict[str, float]]], streams: int) -> list[str]:
    """Issue 29's targets against llama-server, for what was measured."""
    out = []
    single = figures.get(SINGLE, {})
    if LLAMA in single:
        base = single[LLAMA]["tpot_p50_ms"]
        for mode, bound in (("fast", 1.0), ("exact", 1.5)):
            if f"pagedserve {mode}" in single:
                ratio = single[f"pagedserve {mode}"]["tpot_p50_ms"] / base
                out.append(f"1 stream, TPOT p50 {mode} / llama-server: {ratio:.2f}x (target at most {bound:g}x): "
                           f"{'met' if ratio <= bound else 'NOT met'}")
    multi = figures.get(f"{streams} {MULTI}", {})
    for name, f in multi.items():
        if name == LLAMA:
            continue
        if LLAMA in multi:
            ratio = f["output_tok_s"] / multi[LLAMA]["output_tok_s"]
            out.append(f"{streams} streams, output tok/s {name} / llama-server: {ratio:.2f}x (target at least 2x): "
                       f"{'met' if ratio >= 2.0 else 'NOT met'}")
        itl = f["itl_p99_ms"] / f["tpot_p50_ms"]
        out.append(f"{streams} streams, {name} ITL p99 / TPOT p50: {itl:.2f}x (target at most 2.5x): "
                   f"{'met' if itl <= 2.5 else 'NOT met'}")
    return out


class LlamaServer:
    """llama.cpp's server on a free loopback port until the block ends."""

    def __init__(self, binary: str, model: str, threads: int, parallel: int, ctx: int) -> None:
        self.port = free_port()
        self.args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                     "-tb", str(threads), "-np", str(parallel), "-c", str(ctx)]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        self._proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self.log_text()  # stop() removes the file
                self.stop()
                raise ServerError(f"llama-server exited ({self._proc.returncode}):\n{log[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return self
            time.sleep(0.3)
        log = self.log_text()
        self.stop()
        raise ServerError(f"llama-server was not ready in {START_TIMEOUT_S:g} s:\n{log[-2000:]}")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def log_text(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def bench_args(url: str, name: str, model: str, *, concurrency: int, requests: int, input_len: int,
               output_len: int, seed: int, warmup: int, out: str) -> list[str]:
    """The `pagedserve bench` arguments of one run."""
    return ["--base-url", url, "--served-model-name", name, "--model", model, "--endpoint", "completions",
            "--workload", "random", "--input-len", str(input_len), "--output-len", str(output_len),
            "--ignore-eos", "--concurrency", str(concurrency), "--num-requests", str(requests),
            "--warmup", str(warmup), "--seed", str(seed), "--save-requests", "--no-progress", "--out", out]


def run_bench(args: list[str]) -> dict[str, Any]:
    """One `pagedserve bench` run in its own process; its JSON's only point."""
    proc = subprocess.run([sys.executable, *BENCH, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pagedserve bench {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = args[args.index("--out") + 1]
    point: dict[str, Any] = json.loads(Path(out).read_text())["points"][0]
    return point


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[dict[str, tuple[str, int]]]:
    """name -> (URL, pid) of every server under test."""
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with contextlib.ExitStack() as stack:
        out = {}
        for mode in args.modes:
            s = stack.enter_context(Server(["--backend", "numpy", "--model", args.model, "--weights", "gguf",
                                            "--cpu-precision", mode]))
            out[f"pagedserve {mode}"] = (s.url, s.pid)
        ls = stack.enter_context(LlamaServer(args.llama_server, args.model, args.threads, args.streams, args.ctx))
        out[LLAMA] = (ls.url, ls.pid)
        yield out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True, help="the llama-server binary")
    parser.add_argument("--model", default=None, help="the GGUF file (default: the installed default model)")
    parser.add_argument("--modes", default="exact,fast", help="pagedserve's --cpu-precision values")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--single-requests", type=int, default=4, help="one stream: requests per server and round")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--multi-requests", type=int, default=24, help="--streams: requests per server and round")
    parser.add_argument("--single-input", type=int, default=128)
    parser.add_argument("--multi-input", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=16384, help="llama-server's -c (shared by its -np slots)")
    parser.add_argument("--json", default=None, help="also write the pooled figures here")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if args.model is None:
        from backends.model.loader import default_model_path  # noqa: PLC0415 - only when not given

        args.model = str(default_model_path())
    multi = f"{args.streams} {MULTI}"
    pooled: dict[str, dict[str, Pooled]] = {SINGLE: {}, multi: {}}
    load_before = load_average()
    started = time.monotonic()
    with servers(args) as up, tempfile.TemporaryDirectory() as tmp:
        names = {name: served_model(url) for name, (url, _) in up.items()}
        order = list(up)
        for r in range(args.rounds):
            turn = order if r % 2 == 0 else order[::-1]
            for load, conc, n, plen in ((SINGLE, 1, args.single_requests, args.single_input),
                                        (multi, args.streams, args.multi_requests, args.multi_input)):
                for name in turn:
                    url = up[name][0]
                    run = bench_args(url, names[name], args.model, concurrency=conc, requests=n, input_len=plen,
                                     output_len=args.output_len, seed=r, warmup=1 if r == 0 and conc == 1 else 0,
                                     out=f"{tmp}/run.json")
                    pooled[load].setdefault(name, Pooled()).add_run(run_bench(run))
                    print(f"round {r + 1}/{args.rounds}, {load}, {name}: done at "
                          f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        rss = {name: rss_mib(pid) for name, (_, pid) in up.items()}
    load_after = load_average()
    figures = {load: {name: p.figures() for name, p in servers_.items()} for load, servers_ in pooled.items()}
    print(f"model: {args.model}; threads {args.threads}; {args.rounds} rounds; "
          f"{time.monotonic() - started:.0f} s; 1-minute load average {load_before:.2f} before, {load_after:.2f} "
          f"after")
    print("\n".join(report(figures, args.streams)))
    for load, servers_ in pooled.items():
        for name, p in servers_.items():
            if p.errors:
                print(f"failed, {load}, {name}: " + ", ".join(f"{k} x{n}" for k, n in p.errors.items()))
    print("resident memory at the end: " + ", ".join(f"{n} {m:.0f} MiB" for n, m in rss.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "args": vars(args), "load_average":
                                               [load_before, load_after], "rss_mib": rss, "figures": figures,
                                               "pooled": {ld: {n: asdict(p) for n, p in s.items()}
                                                          for ld, s in pooled.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
