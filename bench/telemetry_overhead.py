"""Telemetry overhead: engine throughput with tracing on (every token event, OTLP/HTTP export) vs off.

    python -m bench.telemetry_overhead [--backend sim|numpy] [--profile cpu] [--streams 32] [--prompt 32]
                                       [--tokens 64] [--repeats 3] [--modes off,metrics,tracing,sampled]

Each run drives the async Engine (as the server does) with --streams concurrent requests submitted at once,
each --prompt tokens long and generating exactly --tokens tokens (EOS ignored); throughput is output tokens /
wall time from the first submission to the last token. Modes:

- off: Telemetry(enabled=False), every hook returns at once (as good as no observer);
- metrics: Prometheus metrics and ITL attribution, no tracing (exporter "none");
- tracing: metrics plus traces with token_events="all" and step spans, exported over OTLP/HTTP to a local
  sink that runs in a separate process (so receiving the export does not compete with the engine);
- sampled: the same with token_events="every:16".

Modes are interleaved --repeats times (off, metrics, tracing, off, ...) and the median of each is compared, so
slow drift of a shared machine hits every mode alike; the process's CPU time per output token (all threads,
the export of the run's last spans included) is reported beside the throughput. Backends: the sim backend on
the real clock with a hardware profile (step time is spent sleeping, as a GPU step is spent waiting on the
device), or the NumPy model on this CPU. The sink reports how many export requests and bytes it received;
spans dropped must be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

from backends.base import Backend
from backends.config import BackendConfig
from backends.model.loader import open_model
from backends.registry import create_backend
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import Engine
from scheduler.output_processor import TokenizerLike
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry import Telemetry, TelemetryConfig

BLOCK_SIZE = 16
MODES = ("off", "metrics", "tracing", "sampled")


@dataclass(frozen=True)
class Run:
    mode: str
    seconds: float
    cpu_seconds: float  # this process, all threads: less sensitive than wall time to a busy shared host
    tokens: int
    spans_dropped: int

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_seconds / self.tokens


# --- the OTLP sink (a separate process) ----------------------------------------------------------------------
class SinkHandler(BaseHTTPRequestHandler):
    requests = 0
    received = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        SinkHandler.requests += 1
        SinkHandler.received += len(body)
        self._reply(b"", "application/x-protobuf")

    def do_GET(self) -> None:
        self._reply(json.dumps({"requests": SinkHandler.requests, "bytes": SinkHandler.received}).encode(),
                    "application/json")

    def _reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_sink() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SinkHandler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def start_sink() -> tuple[subprocess.Popen[str], str]:
    sink = subprocess.Popen([sys.executable, "-m", "bench.telemetry_overhead", "--sink"], stdout=subprocess.PIPE,
                            text=True)
    assert sink.stdout is not None
    return sink, f"http://127.0.0.1:{int(sink.stdout.readline())}"


def sink_stats(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/stats", timeout=5) as reply:
        stats: dict[str, int] = json.loads(reply.read())
    return stats


# --- runs ----------------------------------------------------------------------------------------------------
def telemetry_for(mode: str, endpoint: str) -> Telemetry:
    if mode == "off":
        return Telemetry(TelemetryConfig(enabled=False))
    if mode == "metrics":
        return Telemetry(TelemetryConfig(exporter="none"))
    events = "all" if mode == "tracing" else "every:16"
    return Telemetry(TelemetryConfig(exporter="otlp-http", endpoint=endpoint, token_events=events))


async def drive(engine: Engine, streams: int, prompt: int, tokens: int) -> tuple[float, int]:
    await engine.start()
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    handles = [engine.submit(EngineRequest(f"s{i}", tuple(1000 + (31 * i + 7 * j) % 30000 for j in range(prompt)),
                                           params)) for i in range(streams)]
    outs = await asyncio.gather(*(h.collect() for h in handles))
    elapsed = time.perf_counter() - started
    await engine.stop()
    return elapsed, sum(len(o.choices[0].token_ids) for o in outs)


def run_once(mode: str, backend: Backend, tokenizer: TokenizerLike, args: argparse.Namespace,
             endpoint: str) -> Run:
    telemetry = telemetry_for(mode, endpoint)
    max_len = args.prompt + args.tokens + BLOCK_SIZE
    kv = PagedKVCacheManager(args.num_blocks, BLOCK_SIZE)
    config = SchedulerConfig(max_num_seqs=args.streams, max_num_batched_tokens=args.budget)
    engine = Engine(config, kv, backend, tokenizer, max_model_len=max_len, observer=telemetry)
    cpu = time.process_time()
    seconds, tokens = asyncio.run(drive(engine, args.streams, args.prompt, args.tokens))
    telemetry.flush(30.0)  # the export of the run's last spans counts as the run's CPU time
    cpu = time.process_time() - cpu
    telemetry.shutdown()
    return Run(mode, seconds, cpu, tokens, telemetry.spans_dropped)


def build_backend(args: argparse.Namespace) -> tuple[Backend, TokenizerLike]:
    _, files = open_model()
    if args.backend == "sim":
        config = BackendConfig(name="sim", sim_profile=args.profile, sim_clock="real")
    else:
        config = BackendConfig(name="numpy")
    backend = create_backend(config, files)
    backend.init_cache(args.num_blocks, BLOCK_SIZE)
    return backend, cast(TokenizerLike, files.tokenizer)


def report(runs: list[Run], modes: list[str]) -> None:
    base = statistics.median(r.throughput for r in runs if r.mode == modes[0])
    base_cpu = statistics.median(r.cpu_ms_per_token for r in runs if r.mode == modes[0])
    print(f"{'mode':<9} {'runs (output tokens/s)':<34} {'median':>8} {'vs ' + modes[0]:>8}  "
          f"{'CPU ms/token':>12} {'vs ' + modes[0]:>8} {'dropped':>8}")
    for mode in modes:
        mine = [r for r in runs if r.mode == mode]
        median = statistics.median(r.throughput for r in mine)
        cpu = statistics.median(r.cpu_ms_per_token for r in mine)
        each = ", ".join(f"{r.throughput:.1f}" for r in mine)
        print(f"{mode:<9} {each:<34} {median:>8.1f} {100 * (median / base - 1):>+7.2f}%  "
              f"{cpu:>12.3f} {100 * (cpu / base_cpu - 1):>+7.2f}% {sum(r.spans_dropped for r in mine):>8}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("sim", "numpy"), default="sim")
    parser.add_argument("--profile", default="cpu", help="sim hardware profile (cpu, a100, h100, h200)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--modes", default="off,metrics,tracing", help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args(argv)
    if args.sink:
        serve_sink()
        return
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    backend, tokenizer = build_backend(args)
    sink, endpoint = start_sink()
    try:
        runs = interleave(modes, args.repeats, lambda mode: run_once(mode, backend, tokenizer, args, endpoint))
        stats = sink_stats(endpoint)
    finally:
        sink.terminate()
        sink.wait()
    label = f"sim/{args.profile}" if args.backend == "sim" else "numpy"
    print(f"{label}: {args.streams} streams x {args.tokens} tokens (prompt {args.prompt}), "
          f"{args.repeats} interleaved rounds")
    report(runs, modes)
    print(f"sink received {stats['requests']} OTLP export requests, {stats['bytes'] / 1e6:.1f} MB")


def interleave(modes: list[str], repeats: int, run: Callable[[str], Run]) -> list[Run]:
    runs = []
    for round_ in range(repeats):
        for mode in modes:
            runs.append(run(mode))
            last = runs[-1]
            print(f"  round {round_ + 1} {mode:<8} {last.throughput:8.1f} tok/s ({last.seconds:.2f} s, "
                  f"{last.cpu_ms_per_token:.3f} CPU ms/token)", flush=True)
    return runs


if __name__ == "__main__":
    main()
