"""What every experiment does: start a server per configuration, measure it, keep the figures, and record
where the results came from (machine load, wall time)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.experiments.doc import update_block
from bench.experiments.server import Server
from bench.loadgen.measure import Measurement, Options, measure
from bench.loadgen.probes import GaugeSampler, MetricsSnapshots, Probe
from bench.loadgen.progress import LineProgress, NoProgress
from bench.loadgen.promtext import gauge_values
from bench.loadgen.report import write_json
from bench.loadgen.spec import Bounds, LoadShape, Target
from bench.loadgen.workloads import Workload

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "results"
DOC = REPO / "docs" / "PERFORMANCE.md"
SIM_H200 = ("--backend", "sim", "--sim-profile", "h200", "--sim-clock", "real")
RUNNING = "pagedserve:num_requests_running"
COUNTERS = ("pagedserve:num_preemptions_total", "pagedserve:prefix_cache_queries_total",
            "pagedserve:prefix_cache_hits_total", "pagedserve:generation_tokens_total",
            "pagedserve:engine_step_batch_size_sum", "pagedserve:engine_step_batch_size_count")


@dataclass(frozen=True)
class Point:
    """One configuration under one load: the bench's figures plus what the server's /metrics said."""

    name: str
    server_args: tuple[str, ...]
    measurement: Measurement
    counters: dict[str, float]  # growth of COUNTERS over the measured requests
    running_peak: float  # the most requests /metrics showed running at once (sampled every 100 ms)
    running_mean: float
    running_samples: tuple[tuple[float, float], ...] = field(default=(), repr=False)  # (seconds, running)
    metrics_before: str = field(default="", repr=False)  # the /metrics text around the measured requests
    metrics_after: str = field(default="", repr=False)

    @property
    def mean_batch(self) -> float:
        """Sequences per engine step, averaged over the steps of the measured requests."""
        steps = self.counters.get("pagedserve:engine_step_batch_size_count", 0.0)
        return self.counters.get("pagedserve:engine_step_batch_size_sum", 0.0) / steps if steps else math.nan

    @property
    def preemptions(self) -> float:
        return self.counters.get("pagedserve:num_preemptions_total", math.nan)

    def record(self) -> dict[str, Any]:
        m = self.measurement
        return {"name": self.name, "server_args": self.server_args, "shape": m.record.shape, "summary": m.summary,
                "counters": self.counters, "mean_batch": self.mean_batch, "running_peak": self.running_peak,
                "running_mean": self.running_mean,
                "cross_check": m.cross_check}


@dataclass(frozen=True)
class Setup:
    """Command-line choices shared by every experiment."""

    out_dir: Path
    doc: Path | None
    progress: bool
    scale: float  # multiplies request counts: < 1 for a quick look, > 1 for tighter percentiles

    def count(self, n: int) -> int:
        return max(8, round(n * self.scale))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where the JSON and PNG go")
    p.add_argument("--doc", type=Path, default=DOC, help="the markdown file whose Experiments block is rewritten")
    p.add_argument("--no-doc", action="store_true", help="leave the markdown alone")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the request counts (default 1)")
    p.add_argument("--no-progress", action="store_true")
    return p


def setup_of(args: argparse.Namespace) -> Setup:
    return Setup(args.out_dir, None if args.no_doc else args.doc, not args.no_progress, args.scale)


@dataclass(frozen=True)
class Run:
    """One measurement against an already started server."""

    name: str
    workload: Workload
    shape: LoadShape
    bounds: Bounds
    endpoint: str = "completions"


def run_point(name: str, server_args: Sequence[str], workload: Workload, shape: LoadShape, bounds: Bounds,
              setup: Setup, endpoint: str = "completions") -> Point:
    """Start a server with `server_args`, measure `workload` at `shape` against it, stop it."""
    return run_points(server_args, [Run(name, workload, shape, bounds, endpoint)], setup)[0]


def run_points(server_args: Sequence[str], runs: Sequence[Run], setup: Setup) -> list[Point]:
    """Start one server and measure each run against it in turn (each with its own warm-up)."""
    print(f"pagedserve serve {' '.join(server_args)}", file=sys.stderr, flush=True)
    with Server(server_args) as server:
        return [asyncio.run(_measure(r.name, tuple(server_args), server.url, r.workload, r.shape, r.bounds, setup,
                                     r.endpoint))
                for r in runs]


async def _measure(name: str, server_args: tuple[str, ...], url: str, workload: Workload, shape: LoadShape,
                   bounds: Bounds, setup: Setup, endpoint: str) -> Point:
    snapshots, sampler = MetricsSnapshots(url), GaugeSampler(url, (RUNNING,))
    probes: list[Probe] = [snapshots, sampler]
    options = Options(check_metrics=True, progress=LineProgress() if setup.progress else NoProgress())
    m = await measure(Target(url, endpoint), workload, shape, bounds, options, probes)
    before, after = gauge_values(snapshots.before), gauge_values(snapshots.after)
    counters = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS if k in after}
    running = tuple(zip(sampler.times, sampler.samples.get(RUNNING, ()), strict=True))
    return Point(name, server_args, m, counters, sampler.peak(RUNNING), sampler.mean(RUNNING), running,
                 snapshots.before, snapshots.after)


@dataclass
class Provenance:
    """Where and how long: recorded in each JSON and stated under each table."""

    command: str
    started: float = field(default_factory=time.monotonic)
    load_start: float = field(default_factory=lambda: os.getloadavg()[0])

    def finish(self) -> dict[str, Any]:
        return {"command": self.command, "wall_s": round(time.monotonic() - self.started, 1),
                "load_average_start": round(self.load_start, 1), "load_average_end": round(os.getloadavg()[0], 1),
                "cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}

    @staticmethod
    def line(info: dict[str, Any]) -> str:
        return (f"Ran in {info['wall_s']:.0f} s on {info['cpus']} vCPUs (1-minute load average "
                f"{info['load_average_start']:g} at the start, {info['load_average_end']:g} at the end).")


def save(setup: Setup, key: str, payload: dict[str, Any]) -> Path:
    return write_json(setup.out_dir / f"{key}.json", payload)


def publish(setup: Setup, key: str, text: str) -> None:
    """Print an experiment's table and, unless told not to, rewrite its block in docs/PERFORMANCE.md."""
    if setup.doc is not None:
        update_block(setup.doc, key, text)
    print(text)


@dataclass(frozen=True)
class GridExperiment:
    """An experiment that runs a set of points and reports them: parse flags, run, save JSON, plot, publish."""

    key: str
    command: str
    doc: str
    run: Callable[[Setup], Mapping[Any, Point]]
    plot: Callable[[Any, Path], None]
    report: Callable[[Any, dict[str, object]], str]
    meta: Mapping[str, Any] = field(default_factory=dict)  # extra JSON fields, e.g. the workload

    def main(self, argv: Sequence[str] | None = None) -> int:
        setup = setup_of(parser(self.doc).parse_args(argv))
        provenance = Provenance(self.command)
        points = self.run(setup)
        info = provenance.finish()
        save(setup, self.key, {"experiment": self.key, "provenance": info, **self.meta,
                               "points": [p.record() for p in points.values()]})
        self.plot(points, setup.out_dir / f"{self.key}.png")
        publish(setup, self.key, self.report(points, info))
        return 0
