"""Paged vs contiguous KV cache in the same memory, over HTTP: how many requests run at once, and what that
does to throughput and latency.

    python -m bench.experiments.kv_layout [--scale 1] [--no-doc] [--no-progress]

Both servers get the same pool (--num-blocks, so the same bytes) and max_model_len. The contiguous layout
reserves max_model_len for every sequence, the paged one only the blocks a sequence has filled. 32 closed-loop
clients, max_num_seqs 32, long-tailed prompt and output lengths.
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
from bench.loadgen.plot import pyplot
from bench.loadgen.spec import Bounds, LoadShape
from bench.loadgen.workloads import Lengths, RandomWorkload

KEY = "kv-layout"
COMMAND = "python -m bench.experiments.kv_layout"
LAYOUTS = ("paged", "contiguous")
NUM_BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 512, 16, 2048
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, fp16 (the h200 profile's dtype)
CLIENTS = 32
REQUESTS = 192
WORKLOAD = RandomWorkload(Lengths(128, "lognormal", 1.0, 1024), Lengths(128, "lognormal", 1.0, 1024), seed=0)
SAMPLE_INTERVAL_S = 0.1


def server_args(layout: str) -> tuple[str, ...]:
    return (*SIM_H200, "--kv-layout", layout, "--num-blocks", str(NUM_BLOCKS), "--block-size", str(BLOCK_SIZE),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(CLIENTS), "--max-num-batched-tokens",
            "2048", "--no-enable-prefix-caching")


def run(setup: Setup) -> dict[str, Point]:
    bounds = Bounds(setup.count(REQUESTS), None, warmup=4)
    return {layout: run_point(layout, server_args(layout), WORKLOAD, LoadShape(concurrency=CLIENTS), bounds, setup)
            for layout in LAYOUTS}


def plot(points: dict[str, Point], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [2, 1]})
    for layout, p in points.items():
        left.plot([t for t, _ in p.running_samples], [v for _, v in p.running_samples], label=layout,
                  drawstyle="steps-post")
    left.set_xlabel("time (s)")
    left.set_ylabel("requests running (sampled from /metrics)")
    left.legend()
    left.grid(True, alpha=0.3)
    names = list(points)
    right.bar(names, [points[n].measurement.summary.output_throughput for n in names], color=["C0", "C1"])
    right.set_ylabel("output throughput (tokens/s)")
    fig.suptitle(f"paged vs contiguous KV in {NUM_BLOCKS} blocks of {BLOCK_SIZE} tokens (sim h200, real clock)",
                 fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(points: dict[str, Point], info: dict[str, object]) -> str:
    rows: list[tuple[object, ...]] = []
    for layout, p in points.items():
        s = p.measurement.summary
        rows.append((layout, p.running_peak, p.running_mean, p.mean_batch, s.output_throughput, s.ttft_ms.p50,
                     s.ttft_ms.p99, s.tpot_ms.p50, s.tpot_ms.p99, p.preemptions))
    paged, contiguous = points["paged"], points["contiguous"]
    ps, cs = paged.measurement.summary, contiguous.measurement.summary
    rows.append(("**paged / contiguous**", f"**{paged.running_peak / contiguous.running_peak:.1f}x**", "",
                 f"{paged.mean_batch / contiguous.mean_batch:.1f}x",
                 f"**{ps.output_throughput / cs.output_throughput:.2f}x**", "",
                 f"{ps.ttft_ms.p99 / cs.ttft_ms.p99:.2f}x", "", f"{ps.tpot_ms.p99 / cs.tpot_ms.p99:.2f}x", ""))
    headers = ("layout", "max running", "mean running", "batch", "out tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
               "TPOT p50 (ms)", "TPOT p99 (ms)", "preemptions")
    memory_mib = NUM_BLOCKS * BLOCK_SIZE * KV_BYTES_PER_TOKEN / 2**20
    reserve = MAX_MODEL_LEN // BLOCK_SIZE
    return f"""### Paged vs contiguous KV at equal memory (over HTTP)

```
{COMMAND}
```

Sim backend, `h200` profile, real clock. Both servers: `--num-blocks {NUM_BLOCKS} --block-size {BLOCK_SIZE}` (the
same {memory_mib:.0f} MiB of fp16 KV: {KV_BYTES_PER_TOKEN:,} B per token), `--max-model-len {MAX_MODEL_LEN}
--max-num-seqs {CLIENTS} --max-num-batched-tokens 2048 --no-enable-prefix-caching`; {CLIENTS} closed-loop
clients, {REQUESTS} measured requests after 4 warm-up ones. Prompts and outputs log-normal (median 128 tokens
each, sigma 1, each capped at 1024), `ignore_eos`, seed 0. The contiguous layout reserves {reserve} blocks
(max_model_len) per sequence, so at most {NUM_BLOCKS // reserve} run at once; the paged one admits a request when
its prompt's blocks are free and preempts (recompute) the newest request when a running one needs a block and
none is left. "max/mean running": `pagedserve:num_requests_running` sampled from `/metrics` every
{SAMPLE_INTERVAL_S * 1000:.0f} ms; "batch": mean sequences per engine step; "preemptions": the growth of
`pagedserve:num_preemptions`. Results: `docs/results/{KEY}.json`, plot: `docs/results/{KEY}.png` (running
requests over time, and throughput).

{table(headers, rows, [False, *([True] * 9)])}

{Provenance.line(info)}
"""


EXPERIMENT = GridExperiment(KEY, COMMAND, __doc__ or "", run, plot, report, {"workload": WORKLOAD})
main = EXPERIMENT.main


if __name__ == "__main__":
    raise SystemExit(main())
