"""One measured run end to end (load, metrics, optional /metrics cross-check), and a sweep of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.loadgen.crosscheck import CrossCheck, cross_check
from bench.loadgen.metrics import RequestMetrics, Summary, TokenCounter, error_counts, ok_metrics, summary_of
from bench.loadgen.probes import MetricsSnapshots, Probe
from bench.loadgen.progress import Progress
from bench.loadgen.runner import RunRecord, run_load
from bench.loadgen.slo import Slo
from bench.loadgen.spec import Bounds, LoadShape, Target
from bench.loadgen.speculation import Speculation, speculation_between
from bench.loadgen.workloads import Workload


@dataclass(frozen=True)
class Options:
    slo: Slo | None = None
    count_tokens: TokenCounter | None = None
    check_metrics: bool = False  # scrape /metrics around the run and compare its histograms
    progress: Progress | None = None


@dataclass(frozen=True)
class Measurement:
    record: RunRecord
    requests: tuple[RequestMetrics, ...]  # the successful ones
    summary: Summary
    cross_check: CrossCheck | None
    speculation: Speculation | None = None  # the server's speculative decoding over the run, when it counts it


async def measure(target: Target, workload: Workload, shape: LoadShape, bounds: Bounds,
                  options: Options | None = None, probes: Sequence[Probe] = ()) -> Measurement:
    opts = options or Options()
    # Always scraped (counters need no settling unless histograms are compared): /metrics says how many
    # guessed tokens the server kept over the run.
    snapshots = MetricsSnapshots(target.base_url, settle_s=0.3 if opts.check_metrics else 0.0)
    record = await run_load(target, workload, shape, bounds, opts.progress, [*probes, snapshots])
    ok = ok_metrics(record.results, opts.count_tokens)
    summary = summary_of(shape.label(), ok, error_counts(record.results), record.duration_s, opts.slo)
    check = cross_check(snapshots.before, snapshots.after, ok) if opts.check_metrics else None
    return Measurement(record, ok, summary, check, speculation_between(snapshots.before, snapshots.after))


async def measure_all(target: Target, workload: Workload, shapes: Sequence[LoadShape], bounds: Bounds,
                      options: Options | None = None) -> list[Measurement]:
    """The same workload (the same seeded requests) at each load shape in turn."""
    return [await measure(target, workload, shape, bounds, options) for shape in shapes]
