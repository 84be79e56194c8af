"""The HTTP service's own overhead: tokens/s streamed over SSE with the zero-cost sim backend.

    python -m bench.service_overhead [--streams 64] [--duration 10] [--max-tokens 256] [--endpoint chat]
                                     [--profile server.prof] [--viewers 1 --rounds 3]

The server runs as a subprocess (`pagedserve serve --backend sim --sim-profile zero`, optionally under
cProfile); this process is the load generator: `--streams` concurrent streaming requests, each worker
starting a new one as soon as its last ends, for `--duration` seconds. Completion tokens are counted from
each stream's usage chunk. For reference it also measures the engine alone (the offline API, no HTTP) on
the same workload, and with --profile it prints where the server's time went, grouped by package.

With --viewers N, the measured window runs --rounds times with no dashboard viewer and --rounds times with N
viewers reading GET /dashboard/events (each a process of its own, as a browser would be), interleaved on the same
server, and prints both throughputs, the server's CPU per token, each step record's delay from the step's end to
its arrival at a viewer (p50/p95/p99), and the records dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.stats import pct

PROMPT = "Hello"
SERVER_FLAGS = ["--backend", "sim", "--sim-profile", "zero", "--port", "0", "--num-blocks", "8192",
                "--max-num-seqs", "256", "--log-level", "warning"]


@dataclass(frozen=True)
class LoadResult:
    requests: int
    tokens: int
    events: int
    seconds: float
    server_cpu_s: float = 0.0  # user + system time the server process spent during the run

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


# --- the server process --------------------------------------------------------------------------
def start_server(profile: Path | None, log: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    runner = ["-m", "bench.service_overhead", "--profiled-server", str(profile), "--"] if profile else \
        ["-m", "service"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, *runner, "serve", *SERVER_FLAGS, *extra], stderr=sink,
                                stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text())
        if found and asyncio.run(_ready(found.group(1))):
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not become ready")


async def _ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(proc: subprocess.Popen[bytes], url: str, args: argparse.Namespace) -> LoadResult:
    """The measured run; a profiled server profiles exactly this window (SIGUSR1 starts, SIGUSR2 saves)."""
    before = cpu_seconds(proc.pid)
    if args.profile:
        proc.send_signal(signal.SIGUSR1)
    result = asyncio.run(run_load(url, args.endpoint, args.streams, args.duration, args.max_tokens))
    cpu = cpu_seconds(proc.pid) - before
    if args.profile:
        proc.send_signal(signal.SIGUSR2)
        _wait_for_file(args.profile)
    return LoadResult(result.requests, result.tokens, result.events, result.seconds, cpu)


def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def profiled_server(out: Path, argv: list[str]) -> int:
    """`pagedserve` with cProfile switched on by SIGUSR1 and off (saving to `out`) by SIGUSR2."""
    from service.cli.commands import main as pagedserve  # noqa: PLC0415

    profiler = cProfile.Profile(time.thread_time)  # CPU time of the loop thread, not wall time
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())

    def save(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(str(out))

    signal.signal(signal.SIGUSR2, save)
    return pagedserve(argv)


# --- the load generator --------------------------------------------------------------------------
def request_body(endpoint: str, max_tokens: int) -> tuple[str, dict[str, object]]:
    common = {"max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 1.0,
              "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], **common}
    return "/v1/completions", {"prompt": PROMPT, **common}


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[int, int]:
    """(completion tokens, SSE events) of one streamed request; only the tail is parsed."""
    events, tail = 0, b""
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for data in resp.content.iter_any():
            events += data.count(b"data: ")
            tail = (tail + data)[-512:]
    found = re.search(rb'"completion_tokens":(\d+)', tail)
    if found is None:
        raise RuntimeError(f"no usage chunk at the end of the stream: {tail!r}")
    return int(found.group(1)), events


async def run_load(url: str, endpoint: str, streams: int, duration: float, max_tokens: int) -> LoadResult:
    path, body = request_body(endpoint, max_tokens)
    totals = [0, 0, 0]  # requests, tokens, events
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.perf_counter()
        stop_at = start + duration

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                tokens, events = await one_stream(session, url + path, body)
                totals[0] += 1
                totals[1] += tokens
                totals[2] += events

        await asyncio.gather(*(worker() for _ in range(streams)))
        return LoadResult(totals[0], totals[1], totals[2], time.perf_counter() - start)


# --- dashboard viewers -------------------------------------------------------------------------------
@dataclass
class ViewerLog:
    delays: list[float]  # seconds from each step record's end to its arrival
    dropped: int = 0


async def view(url: str, stop_at: float, log: ViewerLog) -> None:
    """A dashboard viewer: reads the feed until stop_at, noting each step record's delay."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session, \
            session.get(url + "/dashboard/events") as resp:
        resp.raise_for_status()
        event = b""
        while (left := stop_at - time.time()) > 0:
            try:
                line = await asyncio.wait_for(resp.content.readline(), left)
            except TimeoutError:
                return
            if line.startswith(b"event: "):
                event = line[7:].strip()
            elif line.startswith(b"data: ") and event == b"step":
                log.delays.append(time.time() - float(re.search(rb'"end":([0-9.e+]+)', line).group(1)))  # type: ignore[union-attr]
            elif line.startswith(b"data: ") and event == b"dropped":
                log.dropped = int(re.search(rb"\d+", line).group(0))  # type: ignore[union-attr]


def viewer_process(url: str, seconds: float) -> None:
    """The viewer as a process of its own (its parsing kept out of the load generator's): JSON on stdout."""
    log = ViewerLog([])
    asyncio.run(view(url, time.time() + seconds, log))
    print(json.dumps({"delays": log.delays, "dropped": log.dropped}))


async def load_with_viewers(url: str, args: argparse.Namespace, viewers: int) -> tuple[LoadResult, ViewerLog]:
    watching = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.service_overhead", "--viewer", url, str(args.duration + 0.5),
        stdout=asyncio.subprocess.PIPE) for _ in range(viewers)]
    await asyncio.sleep(0.5 if viewers else 0)  # connected before the load starts
    result = await run_load(url, args.endpoint, args.streams, args.duration, args.max_tokens)
    log = ViewerLog([])
    for process in watching:
        seen = json.loads((await process.communicate())[0])
        log.delays += seen["delays"]
        log.dropped += seen["dropped"]
    return result, log


def compare_viewers(proc: subprocess.Popen[bytes], url: str, args: argparse.Namespace) -> None:
    """Rounds with no viewer and with args.viewers, interleaved; throughput of each and the records' delays."""
    rates: dict[int, list[float]] = {0: [], args.viewers: []}
    cpu_us: dict[int, list[float]] = {0: [], args.viewers: []}  # server CPU per token
    log = ViewerLog([])
    for _ in range(args.rounds):
        for viewers in (0, args.viewers):
            before = cpu_seconds(proc.pid)
            result, seen = asyncio.run(load_with_viewers(url, args, viewers))
            rates[viewers].append(result.tokens_per_s)
            cpu_us[viewers].append((cpu_seconds(proc.pid) - before) / result.tokens * 1e6)
            log.delays += seen.delays
            log.dropped += seen.dropped
    alone, watched = (_median(rates[v]) for v in (0, args.viewers))
    print(f"{args.streams} streams, {args.rounds} rounds of {args.duration:g} s each way, medians: "
          f"{alone:,.0f} tokens/s with no viewer, {watched:,.0f} with {args.viewers} "
          f"({watched / alone - 1:+.1%}); each way: {_rates(rates[0])} | {_rates(rates[args.viewers])}")
    alone, watched = (_median(cpu_us[v]) for v in (0, args.viewers))
    print(f"server CPU per token, medians: {alone:.2f} us with no viewer, {watched:.2f} us with {args.viewers} "
          f"({watched / alone - 1:+.1%})")
    delays = [d * 1e3 for d in log.delays]
    print(f"step records seen: {len(delays)}, dropped: {log.dropped}; delay from a step's end to a viewer, ms: "
          f"p50 {pct(delays, 0.5):.1f}, p95 {pct(delays, 0.95):.1f}, p99 {pct(delays, 0.99):.1f}, "
          f"max {max(delays):.1f}")


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


# --- the engine alone, for reference ---------------------------------------------------------------
def engine_only(streams: int, max_tokens: int, rounds: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of the offline API on the same workload."""
    from scheduler.params import SamplingParams  # noqa: PLC0415
    from service.app.assemble import build_llm, build_parts  # noqa: PLC0415
    from service.config.settings import load_config  # noqa: PLC0415

    config = load_config(None, {}, {"backend": "sim", "num_blocks": "8192", "max_num_seqs": "256"})
    parts = build_parts(config)
    llm = build_llm(config, parts)
    prompt = parts.files.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start, cpu = time.perf_counter(), time.process_time()
    tokens = 0
    for _ in range(rounds):
        outs = llm.generate([prompt] * streams, params)
        tokens += sum(out.completion_tokens for out in outs)
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu)


# --- the profile -------------------------------------------------------------------------------------
CATEGORIES = (("service (ours)", "/service/"), ("scheduler (engine)", "/scheduler/"), ("kvpool", "/kvpool/"),
              ("sim backend", "/sim_backend/"), ("aiohttp", "/aiohttp/"), ("msgspec", "msgspec"),
              ("asyncio/uvloop", "asyncio"), ("uvloop", "uvloop"), ("tokenizer", "/model/"))


def profile_report(path: Path, top: int = 20) -> str:
    stats = pstats.Stats(str(path))
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in raw.values())
    by_category: dict[str, float] = {}
    for (filename, _, name), (_, _, tt, _, _) in raw.items():
        label = next((c for c, key in CATEGORIES if key in filename), "other: " + _short(filename, name))
        by_category[label] = by_category.get(label, 0.0) + tt
    lines = [f"profiled server CPU time (event-loop thread, measured window): {total:.2f} s, by own time:"]
    grouped = sorted(by_category.items(), key=lambda kv: -kv[1])
    lines += [f"  {share / total:6.1%}  {label}" for label, share in grouped[:12]]
    lines.append(f"top {top} functions by own time:")
    ranked = sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]
    lines += [f"  {tt / total:6.1%}  {ncalls:>9}  {_short(f, n)}:{line}"
              for (f, line, n), (_, ncalls, tt, _, _) in ranked]
    return "\n".join(lines)


def _short(filename: str, name: str) -> str:
    parts = Path(filename).parts
    return ("/".join(parts[-2:]) if len(parts) > 1 else filename) + f"({name})"


def main() -> None:
    if sys.argv[1:2] == ["--viewer"]:  # a dashboard viewer of --viewers: <url> <seconds>
        viewer_process(sys.argv[2], float(sys.argv[3]))
        return
    if sys.argv[1:2] == ["--profiled-server"]:  # the server side of --profile: <out> -- <pagedserve args>
        sys.exit(profiled_server(Path(sys.argv[2]), sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--profile", type=Path, default=None, help="run the server under cProfile, save here")
    parser.add_argument("--skip-engine-baseline", action="store_true")
    parser.add_argument("--viewers", type=int, default=0, help="compare with this many dashboard viewers")
    parser.add_argument("--rounds", type=int, default=3, help="with --viewers: rounds each way, interleaved")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="passed on to `pagedserve serve` (repeat; e.g. --server-arg=--max-stream-events-per-s=0)")
    args = parser.parse_args()
    log = Path(tempfile.mkstemp(prefix="service-overhead-", suffix=".log")[1])
    if args.profile:
        args.profile.unlink(missing_ok=True)
    proc, url = start_server(args.profile, log, args.server_arg)
    try:
        asyncio.run(run_load(url, args.endpoint, args.streams, 1.0, args.max_tokens))  # warm-up
        if args.viewers:
            compare_viewers(proc, url, args)
            return
        result = measure(proc, url, args)
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"{args.streams} streams, /v1/{args.endpoint}, max_tokens {args.max_tokens}, {result.seconds:.1f} s: "
          f"{result.requests} requests, {result.tokens} tokens, {result.tokens_per_s:,.0f} tokens/s over SSE, "
          f"{result.events / result.seconds:,.0f} SSE events/s ({result.tokens / max(result.events, 1):.2f} "
          "tokens per event)")
    print(f"server CPU: {result.server_cpu_s:.2f} s ({result.server_cpu_s / result.seconds:.0%} of one core), "
          f"{result.server_cpu_s / result.tokens * 1e6:.1f} us per token, i.e. "
          f"{result.tokens / result.server_cpu_s:,.0f} tokens per CPU-second")
    if not args.skip_engine_baseline:
        rate, per_cpu = engine_only(args.streams, args.max_tokens, rounds=3)
        print(f"engine alone (offline API, same workload, no HTTP): {rate:,.0f} tokens/s, "
              f"{per_cpu:,.0f} tokens per CPU-second")
    if args.profile:
        print(profile_report(args.profile))


if __name__ == "__main__":
    main()
