"""The ITL target's trade: stalls (ITL p99) against time to first token and throughput, swept over
`--itl-target-ms`, on the NumPy backend over HTTP and on the sim backend's H100 profile.

    python -m bench.experiments.itl_target [--scale 1] [--rounds 2] [--skip-numpy] [--no-doc] [--no-progress]
                                           [--numpy-targets 0,auto,100 --http-only --out-dir DIR]  (an A/B over HTTP)

A target is a number of ms (0 = off: the fixed token budget) or `auto` (the default: set step by step from the
step's decode part and the prompts waiting, scheduler/itl_target.py); each row says the target in force, for auto
the limit of the last step that prefilled beside decodes, as the server's /metrics
(`pagedserve:itl_target_seconds`) or the engine reported it. NumPy over HTTP: one `pagedserve serve` per
target, all started first; 16 closed-loop clients, 256-token random prompts, 128 output tokens; the targets take
turns round after round, so a host that speeds up or slows down moves them alike, and each point pools its
rounds (the JSON keeps each round's throughput, TTFT p99 and ITL p99 / TPOT p50 too). NumPy engine alone: the
same load stepped in this process (bench/closed_loop_sim.run_engine), no HTTP and no service beside the steps,
to tell the scheduler's effect from the contention a server adds on 2 cores. Sim: the engine stepped on the
virtual clock (bench/closed_loop_sim.py) for a Llama-3-8B shape on the h100 profile with the throughput preset
(max_num_seqs 256, 8192-token budget): 64 clients, 1024-token prompts, 128 output tokens; exact and
deterministic, so one round. Writes docs/results/itl-target.{json,png} and its block of PERFORMANCE.md.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from backends.config import BackendConfig
from backends.model.loader import open_model
from backends.numpy_backend.process_env import reexec_with_defaults
from backends.registry import create_backend
from bench.closed_loop_sim import Load, SimResult, run_engine, simulate
from bench.experiments.common import Provenance, Setup, parser, publish, save, setup_of
from bench.experiments.doc import table
from bench.experiments.server import Server
from bench.loadgen.measure import Measurement, Options, measure
from bench.loadgen.metrics import RequestMetrics
from bench.loadgen.plot import pyplot
from bench.loadgen.probes import MetricsSnapshots
from bench.loadgen.progress import LineProgress, NoProgress
from bench.loadgen.promtext import gauge_values
from bench.loadgen.spec import Bounds, LoadShape, Target
from bench.loadgen.workloads import Lengths, RandomWorkload
from scheduler.config import AUTO, SchedulerConfig
from service.config.settings import PRESETS

KEY = "itl-target"
STEP_HISTOGRAM = "pagedserve:engine_step_duration_seconds"
TARGET_GAUGE = "pagedserve:itl_target_seconds"
COMMAND = "python -m bench.experiments.itl_target"
TargetMs = float | Literal["auto"]  # as --itl-target-ms takes it
NUMPY_TARGETS: tuple[TargetMs, ...] = (0.0, AUTO, 50.0, 100.0, 200.0, 400.0)
SIM_TARGETS: tuple[TargetMs, ...] = (0.0, AUTO, 25.0, 50.0, 100.0, 200.0)
NUMPY_WORKLOAD = RandomWorkload(Lengths(256), Lengths(128), seed=0)
NUMPY_CLIENTS, NUMPY_REQUESTS = 16, 48
SIM_PROFILE, SIM_MODEL = "h100", "llama-3-8b"
ENGINE_LOAD = Load(clients=NUMPY_CLIENTS, prompt_len=256, output_len=128, requests=NUMPY_REQUESTS)
SIM_LOAD = Load(clients=64, prompt_len=1024, output_len=128, requests=384)


@dataclass(frozen=True)
class Row:
    """One target's figures (ms, tokens/s)."""

    target_ms: float  # the target in force (for auto: the last step's limit that prefilled beside decodes)
    itl_p99: float
    tpot_p50: float
    ttft_p99: float
    throughput: float
    requests: int
    steps: int = 0  # engine steps the server counted over the measured requests (HTTP rows only; 0: not read)
    step_seconds: float = 0.0  # and their summed time
    auto: bool = False  # target_ms was derived ("auto"), not given
    # each round's output tokens/s, TTFT p99 and ITL p99 / TPOT p50, HTTP rows only: on a shared host the
    # spread between rounds says how far the pooled figures can be trusted, and the first round (every
    # stream starting at once) is a burst the later rounds are not
    round_throughput: tuple[float, ...] = ()
    round_ttft_p99: tuple[float, ...] = ()
    round_stall_ratio: tuple[float, ...] = ()

    @property
    def stall_ratio(self) -> float:
        return self.itl_p99 / self.tpot_p50

    @property
    def label(self) -> str:
        if self.auto:
            return f"auto ({self.target_ms:.0f})"
        return "off" if self.target_ms == 0 else f"{self.target_ms:g}"


def numpy_rows(setup: Setup, rounds: int, targets: Sequence[TargetMs] = NUMPY_TARGETS) -> list[Row]:
    samples: dict[TargetMs, list[tuple[Measurement, StepUse]]] = {t: [] for t in targets}
    with ExitStack() as stack:
        servers = {t: stack.enter_context(Server(["--backend", "numpy", "--itl-target-ms", str(t)]))
                   for t in targets}
        for r in range(rounds):
            for target, server in servers.items():
                print(f"round {r + 1}/{rounds}: --itl-target-ms {target}", file=sys.stderr, flush=True)
                samples[target].append(asyncio.run(_measure(server.url, setup, warmup=4 if r == 0 else 0)))
    return [_pooled(target, ms) for target, ms in samples.items()]


@dataclass(frozen=True)
class StepUse:
    """The engine steps the server's /metrics counted over one measurement."""

    steps: int
    seconds: float
    target_s: float  # the ITL target in force, as /metrics showed it


async def _measure(url: str, setup: Setup, warmup: int) -> tuple[Measurement, StepUse]:
    options = Options(progress=LineProgress() if setup.progress else NoProgress())
    bounds = Bounds(setup.count(NUMPY_REQUESTS), None, warmup=warmup)
    snapshots = MetricsSnapshots(url)
    run = await measure(Target(url), NUMPY_WORKLOAD, LoadShape(concurrency=NUMPY_CLIENTS), bounds, options,
                        probes=[snapshots])
    (count, total), (count0, total0) = _step_totals(snapshots.after), _step_totals(snapshots.before)
    target_s = gauge_values(snapshots.after).get(TARGET_GAUGE, 0.0)
    return run, StepUse(int(count - count0), total - total0, target_s)


def _step_totals(text: str) -> tuple[float, float]:
    """(count, sum) of the server's step-duration histogram in a /metrics text ((0, 0) when absent)."""
    found = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
             if s.name.startswith(STEP_HISTOGRAM)}
    return found.get(STEP_HISTOGRAM + "_count", 0.0), found.get(STEP_HISTOGRAM + "_sum", 0.0)


def _pooled(target: TargetMs, runs: Sequence[tuple[Measurement, StepUse]]) -> Row:
    """Percentiles over every round's requests; throughput from the rounds' tokens over their time."""
    measurements = [m for m, _ in runs]
    ok = [m for run in measurements for m in run.requests]
    itl = [gap for m in ok for gap in m.itls]
    tokens = sum(run.summary.output_tokens for run in measurements)
    seconds = sum(run.summary.duration_s for run in measurements)
    return Row(1e3 * runs[0][1].target_s, 1e3 * float(np.percentile(itl, 99)),
               1e3 * float(np.percentile([m.tpot for m in ok if m.tpot is not None], 50)),
               1e3 * _ttft_p99(ok), tokens / seconds, len(ok), sum(u.steps for _, u in runs),
               sum(u.seconds for _, u in runs), target == AUTO,
               tuple(m.summary.output_tokens / m.summary.duration_s for m in measurements),
               tuple(1e3 * _ttft_p99(m.requests) for m in measurements),
               tuple(_stall_ratio(m.requests) for m in measurements))


def _stall_ratio(requests: Sequence[RequestMetrics]) -> float:
    """ITL p99 / TPOT p50 over `requests`."""
    itl = [gap for r in requests for gap in r.itls]
    return float(np.percentile(itl, 99) / np.percentile([r.tpot for r in requests if r.tpot is not None], 50))


def _ttft_p99(requests: Sequence[RequestMetrics]) -> float:
    return float(np.percentile([r.ttft for r in requests if r.ttft is not None], 99))


def engine_rows(setup: Setup, rounds: int) -> list[Row]:
    """The NumPy backend without a server: targets take turns, each round a fresh backend and cache."""
    _, files = open_model(None)
    load = Load(ENGINE_LOAD.clients, ENGINE_LOAD.prompt_len, ENGINE_LOAD.output_len, setup.count(ENGINE_LOAD.requests))
    results: dict[TargetMs, list[SimResult]] = {t: [] for t in NUMPY_TARGETS}
    for r in range(rounds):
        for target in NUMPY_TARGETS:
            print(f"engine round {r + 1}/{rounds}: --itl-target-ms {target}", file=sys.stderr, flush=True)
            backend = create_backend(BackendConfig(name="numpy"), files)
            results[target].append(run_engine(backend, files, SchedulerConfig(itl_target_ms=target), load))
    return [_engine_row(target, runs) for target, runs in results.items()]


def _engine_row(target: TargetMs, runs: Sequence[SimResult]) -> Row:
    pooled = {name: np.concatenate([getattr(r, name) for r in runs]) for name in ("itl", "tpot", "ttft")}
    tokens, seconds = sum(r.output_tokens for r in runs), sum(r.duration for r in runs)
    in_force = float(np.mean([r.itl_target_s for r in runs]))  # each round's own engine, calibrated afresh
    return Row(1e3 * in_force, 1e3 * float(np.percentile(pooled["itl"], 99)),
               1e3 * float(np.percentile(pooled["tpot"], 50)), 1e3 * float(np.percentile(pooled["ttft"], 99)),
               tokens / seconds, sum(len(r.ttft) for r in runs), auto=target == AUTO)


def sim_rows(setup: Setup) -> list[Row]:
    _, files = open_model(None)
    preset = PRESETS["throughput"]
    load = Load(SIM_LOAD.clients, SIM_LOAD.prompt_len, SIM_LOAD.output_len, setup.count(SIM_LOAD.requests))
    rows = []
    for target in SIM_TARGETS:
        config = SchedulerConfig(max_num_seqs=preset["max_num_seqs"],
                                 max_num_batched_tokens=preset["max_num_batched_tokens"], itl_target_ms=target)
        rows.append(_sim_row(target, simulate(files, SIM_PROFILE, config, load, SIM_MODEL), load.requests))
    return rows


def _sim_row(target: TargetMs, r: SimResult, requests: int) -> Row:
    return Row(1e3 * r.itl_target_s, 1e3 * r.p("itl", 99), 1e3 * r.p("tpot", 50), 1e3 * r.p("ttft", 99),
               r.throughput, requests, auto=target == AUTO)


def plot(parts: dict[str, list[Row]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(len(parts), 2, figsize=(11, 4.2 * len(parts)), constrained_layout=True, squeeze=False)
    for (name, rows), (left, right) in zip(parts.items(), axes, strict=True):
        for ax, x, label in ((left, "ttft_p99", "p99 TTFT (ms)"), (right, "throughput", "output tokens/s")):
            ax.plot([getattr(r, x) for r in rows], [r.itl_p99 for r in rows], marker="o", linestyle="none")
            for r in rows:
                ax.annotate(r.label + ("" if r.label == "off" else " ms"), (getattr(r, x), r.itl_p99),
                            fontsize=8, xytext=(4, 4), textcoords="offset points")
            ax.set_xlabel(label)
            ax.set_ylabel("p99 ITL (ms)")
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.set_title(textwrap.fill(name, 60), fontsize=8)
    fig.suptitle("--itl-target-ms: stalls against time to first token and throughput", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(parts: dict[str, list[Row]], info: dict[str, object]) -> str:
    blocks = [f"### The ITL target: stalls against TTFT and throughput\n\nCommand: `{COMMAND}`. "
              f"{Provenance.line(info)} Plot: `docs/results/{KEY}.png`."]
    for name, rows in parts.items():
        base, show_steps = rows[0], all(r.steps for r in rows)
        body = [[r.label, f"{r.itl_p99:.1f}", f"{r.tpot_p50:.1f}",
                 f"{r.stall_ratio:.2f}", f"{r.ttft_p99:.0f}", f"{r.ttft_p99 / base.ttft_p99:.2f}",
                 f"{r.throughput:.1f}", f"{r.throughput / base.throughput:.2f}", str(r.requests)]
                + ([str(r.steps), f"{r.step_seconds:.1f}"] if show_steps else []) for r in rows]
        steps = ["engine steps", "step time s"] if show_steps else []
        blocks.append(f"**{name}**\n\n" + table(
            ["target ms", "ITL p99 ms", "TPOT p50 ms", "ITL p99 / TPOT p50", "TTFT p99 ms", "x off",
             "output tok/s", "x off", "requests", *steps], body))
    return "\n\n".join(blocks)


def _targets(text: str) -> list[TargetMs]:
    return [AUTO if t.strip() == AUTO else float(t) for t in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="NumPy rounds (default 2)")
    p.add_argument("--skip-numpy", action="store_true", help="only the sim part")
    p.add_argument("--numpy-targets", type=_targets, default=list(NUMPY_TARGETS),
                   help="the targets swept over HTTP, comma-separated ms or auto (default 0,auto,50,100,200,400)")
    p.add_argument("--http-only", action="store_true", help="only the NumPy part over HTTP (an A/B of targets)")
    args = p.parse_args(argv)
    setup = setup_of(args)
    provenance = Provenance(COMMAND)
    parts = {}
    if not args.skip_numpy:
        parts[f"numpy (default model, gguf weights), {NUMPY_CLIENTS} clients, 256/128 tokens, "
              f"{args.rounds} rounds, over HTTP"] = numpy_rows(setup, args.rounds, args.numpy_targets)
    if not args.skip_numpy and not args.http_only:
        parts[f"numpy engine alone (same load, no HTTP), {args.rounds} rounds"] = engine_rows(setup, args.rounds)
    if not args.http_only:
        parts[f"sim {SIM_PROFILE}, {SIM_MODEL} shape, throughput preset, {SIM_LOAD.clients} clients, "
              f"{SIM_LOAD.prompt_len}/{SIM_LOAD.output_len} tokens (virtual clock)"] = sim_rows(setup)
    info = provenance.finish()
    save(setup, KEY, {"experiment": KEY, "provenance": info,
                      "parts": {name: [r.__dict__ for r in rows] for name, rows in parts.items()}})
    plot(parts, setup.out_dir / f"{KEY}.png")
    publish(setup, KEY, report(parts, info))
    return 0


if __name__ == "__main__":
    reexec_with_defaults("bench.experiments.itl_target")
    raise SystemExit(main())
