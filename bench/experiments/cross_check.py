"""The bench's latency percentiles against the server's own /metrics histograms for the same requests.

    python -m bench.experiments.cross_check [--scale 1] [--no-doc] [--no-progress]

The server streams one event per engine output (`--max-stream-events-per-s 0`), so a text chunk is a token and
the bench's ITL is comparable with the server's per-token `inter_token_latency_seconds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.experiments.common import SIM_H200, Point, Provenance, Setup, parser, publish, run_point, save, setup_of
from bench.experiments.doc import table
from bench.loadgen.crosscheck import METRICS, bench_samples
from bench.loadgen.plot import pyplot
from bench.loadgen.promtext import find, parse_histograms
from bench.loadgen.spec import Bounds, LoadShape
from bench.loadgen.workloads import Lengths, RandomWorkload

KEY = "cross-check"
COMMAND = "python -m bench.experiments.cross_check"
CLIENTS = 8
REQUESTS = 200
WORKLOAD = RandomWorkload(Lengths(128, "lognormal", 1.0, 1024), Lengths(64, "lognormal", 1.0, 512), seed=0)
SERVER = (*SIM_H200, "--max-stream-events-per-s", "0", "--max-num-seqs", "64")
PLOTTED = ("ttft", "itl")


def run(setup: Setup) -> Point:
    bounds = Bounds(setup.count(REQUESTS), None, warmup=4)
    return run_point("cross-check", SERVER, WORKLOAD, LoadShape(concurrency=CLIENTS), bounds, setup)


def plot(point: Point, before: str, after: str, path: Path) -> None:
    """Per metric: the bench's empirical CDF, and the server's histogram CDF at its bucket bounds."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(11, 4.2), constrained_layout=True)
    samples = bench_samples(point.measurement.requests)
    start, end = parse_histograms(before), parse_histograms(after)
    for ax, metric in zip(axes, PLOTTED, strict=True):
        values = sorted(v * 1e3 for v in samples[metric])
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label="bench (client)",
                drawstyle="steps-post")
        hist = find(end, METRICS[metric])
        if hist is not None:
            h = hist.minus(find(start, METRICS[metric]))
            finite = [(b * 1e3, h.fraction_at_most(i)) for i, b in enumerate(h.bounds) if b != float("inf")]
            ax.plot([b for b, _ in finite], [f for _, f in finite], "o--", label=f"server ({h.name})")
        ax.set_xscale("log")
        positive = [v for v in values if v > 0]
        if positive:
            ax.set_xlim(positive[0] / 2, positive[-1] * 3)  # the buckets reach 80 s: show where the samples are
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("share at or under")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bench vs server histograms, same requests (sim h200, real clock)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(point: Point, info: dict[str, object]) -> str:
    check = point.measurement.cross_check
    assert check is not None
    rows = []
    for c in check.checks:
        q = {round(x.q * 100): x for x in c.quantiles}
        rows.append((c.metric.upper(), q[50].bench_ms, q[50].server_ms, q[90].bench_ms, q[90].server_ms,
                     q[99].bench_ms, q[99].server_ms, f"{c.cdf_gap:.2f}", f"{c.bench_count} / {c.server_count:g}",
                     "yes" if c.consistent else "**no**"))
    headers = ("metric", "p50 bench", "p50 server", "p90 bench", "p90 server", "p99 bench", "p99 server",
               "CDF gap", "samples bench / server", "consistent")
    missing = f"\n\nNot exported by the server: {', '.join(check.missing)}." if check.missing else ""
    return f"""### Cross-check: the bench against the server's /metrics

```
{COMMAND}
pagedserve bench --check-metrics ...     # the same comparison for any run
```

Sim backend, `h200` profile, real clock, `{' '.join(SERVER[6:])}` (one SSE event per engine step, so a text
chunk is one token). {CLIENTS} closed-loop clients, {REQUESTS} measured requests after 4 warm-up ones; prompts
log-normal (median 128, cap 1024), outputs log-normal (median 64, cap 512), `ignore_eos`, seed 0. `/metrics`
is scraped just before and just after the measured requests and the histograms' growth compared with the
bench's samples. The server's percentiles are Prometheus `histogram_quantile` estimates (linear inside a bucket),
so they can only be as fine as its buckets; "consistent" means the bench's value and the server's estimate lie
in the same or neighbouring buckets at p50, p90 and p99, and "CDF gap" is the largest difference, at any bucket
bound, between the share of the bench's samples and of the server's observations at or under it. Times in ms.
Results: `docs/results/{KEY}.json`, plot: `docs/results/{KEY}.png`.

{table(headers, rows, [False, *([True] * 9)])}{missing}

{Provenance.line(info)}

The server times a request from its arrival in the engine, the client from sending it, so the client's TTFT
and E2E include the HTTP exchange, the chat template and tokenization (a few ms here); ITL and TPOT, measured
between tokens, should agree most closely.
"""


def main(argv: Sequence[str] | None = None) -> int:
    setup = setup_of(parser(__doc__ or "").parse_args(argv))
    provenance = Provenance(COMMAND)
    point = run(setup)
    info = provenance.finish()
    save(setup, KEY, {"experiment": KEY, "provenance": info, "workload": WORKLOAD, "points": [point.record()]})
    plot(point, point.metrics_before, point.metrics_after, setup.out_dir / f"{KEY}.png")
    text = report(point, info)
    publish(setup, KEY, text)
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
