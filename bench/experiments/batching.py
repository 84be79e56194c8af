"""Continuous vs static batching at equal concurrency, over HTTP.

    python -m bench.experiments.batching [--scale 1] [--no-doc] [--no-progress]

Closed loop: C clients each send their next request when the last ends, against a server with
max_num_seqs = C and a token budget that admits a whole batch of prompts at once, so static batching always
forms full batches. Prompt and output lengths are log-normal (a long tail), every request generates exactly
its max_tokens (ignore_eos), prefix caching is off, the KV pool never runs short.
"""

from __future__ import annotations

from pathlib import Path

from bench.experiments.common import (
    SIM_H200,
    GridExperiment,
    Point,
    Provenance,
    Setup,
    run_point,
)
from bench.experiments.doc import table
from bench.loadgen.plot import plot_frontier
from bench.loadgen.spec import Bounds, LoadShape
from bench.loadgen.workloads import Lengths, RandomWorkload

KEY = "batching"
COMMAND = "python -m bench.experiments.batching"
POLICIES = ("continuous", "static")
CONCURRENCIES = (8, 32)
REQUESTS = 256
BUDGET = 8192
WORKLOAD = RandomWorkload(Lengths(128, "lognormal", 1.0, 1024), Lengths(64, "lognormal", 1.0, 512), seed=0)


def server_args(policy: str, concurrency: int) -> tuple[str, ...]:
    return (*SIM_H200, "--batching", policy, "--max-num-seqs", str(concurrency),
            "--max-num-batched-tokens", str(BUDGET), "--no-enable-prefix-caching")


def run(setup: Setup) -> dict[tuple[str, int], Point]:
    points = {}
    for c in CONCURRENCIES:
        for policy in POLICIES:
            bounds = Bounds(setup.count(REQUESTS), None, warmup=c)
            points[(policy, c)] = run_point(f"{policy}, concurrency {c}", server_args(policy, c), WORKLOAD,
                                            LoadShape(concurrency=c), bounds, setup)
    return points


def report(points: dict[tuple[str, int], Point], info: dict[str, object]) -> str:
    rows: list[tuple[object, ...]] = []
    for c in CONCURRENCIES:
        for policy in POLICIES:
            p = points[(policy, c)]
            s = p.measurement.summary
            rows.append((c, policy, s.output_throughput, s.request_throughput, s.ttft_ms.p50, s.ttft_ms.p99,
                         s.tpot_ms.p50, s.tpot_ms.p99, p.mean_batch))
        cont, stat = points[("continuous", c)].measurement.summary, points[("static", c)].measurement.summary
        rows.append((c, "**continuous / static**", f"**{cont.output_throughput / stat.output_throughput:.2f}x**",
                     "", "", f"**{cont.ttft_ms.p99 / stat.ttft_ms.p99:.2f}x**", "",
                     f"{cont.tpot_ms.p99 / stat.tpot_ms.p99:.2f}x", ""))
    headers = ("concurrency", "policy", "out tok/s", "req/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)",
               "TPOT p99 (ms)", "batch")
    return f"""### Continuous vs static batching (over HTTP)

```
{COMMAND}
```

Sim backend, `h200` profile, real clock. {REQUESTS} measured requests per row after a warm-up of C requests, C
closed-loop clients, `--max-num-seqs C --max-num-batched-tokens {BUDGET} --no-enable-prefix-caching`. Prompts
log-normal (median 128 tokens, sigma 1, cap 1024), outputs log-normal (median 64, sigma 1, cap 512) with
`ignore_eos`, seed 0, `/v1/completions` streamed. "batch" is the mean number of sequences per engine step, from
the server's `pagedserve:engine_step_batch_size` histogram over the measured requests.
Results: `docs/results/{KEY}.json`, plot: `docs/results/{KEY}.png` (output throughput against p99 TTFT and
p99 TPOT).

{table(headers, rows, [True, False, *([True] * 7)])}

{Provenance.line(info)}

Static batching admits a new batch only when every request of the last one has finished, so each batch runs
as long as its longest output while its slots empty one by one; continuous batching refills a slot as soon as
it frees. The same clients therefore get their requests started sooner (TTFT) and the engine runs fuller
steps (batch).
"""


def plot(points: dict[tuple[str, int], Point], path: Path) -> None:
    series = {policy: [(f"C={c}", points[(policy, c)].measurement.summary) for c in CONCURRENCIES]
              for policy in POLICIES}
    plot_frontier(series, path, "continuous vs static batching (sim h200, real clock)")


EXPERIMENT = GridExperiment(KEY, COMMAND, __doc__ or "", run, plot, report, {"workload": WORKLOAD})
main = EXPERIMENT.main


if __name__ == "__main__":
    raise SystemExit(main())
