"""Served single-stream decode with the weights as the GGUF stores them against float32 weights, A/B in one run:

    python -m bench.experiments.weights [--rounds 3] [--requests 6] [--cpu-isa auto]

Four `pagedserve serve` processes on the NumPy backend and the default model, `--weights gguf`, `--weights
gguf --cpu-precision fast`, the same with `--kv-cache-dtype float16`, and `--weights float32`, all up for the
whole run; one client (concurrency 1) sends
128-token random prompts asking for 128 tokens, `--requests` to one server, then as many to the next, round
after round, so a host that speeds up or slows down moves all alike. Prints TTFT and TPOT (p50, p90) per mode
over every round, the gguf / float32 ratio of TPOT p50 (the target: at most 0.5) and the fast / exact ones; and
each server's resident memory at the end (its whole process: weights, KV pool, kernels, Python), with the gguf /
float32 ratio. `--cpu-isa` builds every server's C kernels for that CPU tier (the figures hold for it alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import Sequence

from backends.numpy_backend.native.cpu_tiers import CpuInfo
from bench.experiments.server import Server
from bench.host import rss_mib
from bench.loadgen.measure import measure
from bench.loadgen.spec import Bounds, LoadShape, Target
from bench.loadgen.workloads import Lengths, RandomWorkload
from bench.stats import pct

FAST = ["--weights", "gguf", "--cpu-precision", "fast"]
MODES = {"gguf": ["--weights", "gguf"], "gguf-fast": FAST, "gguf-fast-kv16": [*FAST, "--kv-cache-dtype", "float16"],
         "float32": ["--weights", "float32"]}
WORKLOAD = RandomWorkload(Lengths(128), Lengths(128), seed=0)


async def one_round(urls: dict[str, str], requests: int, first: bool) -> dict[str, tuple[list[float], list[float]]]:
    """(TTFTs, TPOTs) in seconds per mode for this round's requests."""
    out = {}
    for mode, url in urls.items():
        bounds = Bounds(requests, None, warmup=1 if first else 0)
        m = await measure(Target(url), WORKLOAD, LoadShape(concurrency=1), bounds)
        out[mode] = ([r.ttft for r in m.requests if r.ttft is not None],
                     [r.tpot for r in m.requests if r.tpot is not None])
    return out


def report(samples: dict[str, tuple[list[float], list[float]]], rss: dict[str, float]) -> list[str]:
    lines = [f"{'weights':>14} {'requests':>8} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9}"]
    for mode, (ttft, tpot) in samples.items():
        lines.append(f"{mode:>14} {len(tpot):>8} {pct(ttft, .5) * 1e3:>7.1f}ms {pct(ttft, .9) * 1e3:>7.1f}ms "
                     f"{pct(tpot, .5) * 1e3:>7.2f}ms {pct(tpot, .9) * 1e3:>7.2f}ms")
    p50 = {mode: statistics.median(samples[mode][1]) for mode in samples}
    lines.append(f"resident memory, whole server: {', '.join(f'{m} {mib:.0f} MiB' for m, mib in rss.items())}; "
                 f"gguf / float32: {rss['gguf'] / rss['float32']:.2f}")
    lines.append(f"TPOT p50 gguf / float32: {p50['gguf'] / p50['float32']:.2f} (target: at most 0.5); "
                 f"gguf fast / exact: {p50['gguf-fast'] / p50['gguf']:.2f}; fast over a float16 KV cache / exact: "
                 f"{p50['gguf-fast-kv16'] / p50['gguf']:.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6, help="per mode and round")
    parser.add_argument("--cpu-isa", default="auto", help="the servers' CPU tier (backend.cpu_isa)")
    args = parser.parse_args(argv)
    base = ["--backend", "numpy", "--max-num-seqs", "4", "--cpu-isa", args.cpu_isa]
    with contextlib.ExitStack() as stack:
        servers = {mode: stack.enter_context(Server([*base, *flags])) for mode, flags in MODES.items()}
        urls = {mode: server.url for mode, server in servers.items()}
        samples: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in MODES}
        for r in range(args.rounds):
            for mode, (ttft, tpot) in asyncio.run(one_round(urls, args.requests, r == 0)).items():
                samples[mode][0].extend(ttft)
                samples[mode][1].extend(tpot)
        rss = {mode: rss_mib(server.pid) for mode, server in servers.items()}
    tier = CpuInfo.of_this_host().choose(args.cpu_isa)
    print(f"CPU tier: {tier.name} ({tier.summary}{'' if args.cpu_isa == 'auto' else ', forced'})")
    print("\n".join(report(samples, rss)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
