"""A load generator for OpenAI-compatible servers: a pure HTTP client that imports nothing of this project
outside this package (`pagedserve bench`, bench/bench_cmd.py, hands it a model's tokenizer).

    spec.py        what to send (Target, RequestSpec, sessions) and how (LoadShape, Bounds)
    workloads.py   seeded random prompts, a JSONL file, shared system prompts, multi-turn chat
    arrivals.py    the open-loop arrival process (Poisson, or gamma with a burstiness factor)
    sse.py         the event stream; client.py: one streaming request, timed chunk by chunk
    runner.py      warm-up, then a closed loop (concurrency) or an open loop (rate) within count/time bounds
    metrics.py     TTFT, TPOT, ITL, E2E, throughputs and goodput (vLLM's definitions); slo.py: the bounds
    measure.py     one run end to end; probes.py: /metrics scrapes and gauge sampling during a run
    promtext.py    Prometheus text format; crosscheck.py: the server's histograms against the bench's samples
    sweep.py       one run per concurrency or rate; plot.py: the throughput/latency frontier PNG
    report.py      text and JSON output; progress.py: the stderr progress line; args.py: the options
    cli.py         the command: its parser and main(), for `pagedserve bench` and `python -m bench.loadgen`
"""

from bench.loadgen.measure import Measurement, Options, measure, measure_all
from bench.loadgen.metrics import Stats, Summary, summarize
from bench.loadgen.runner import RunRecord, run_load
from bench.loadgen.spec import Bounds, LoadShape, RequestSpec, Target
from bench.loadgen.workloads import Workload

__all__ = ["Bounds", "LoadShape", "Measurement", "Options", "RequestSpec", "RunRecord", "Stats", "Summary",
           "Target", "Workload", "measure", "measure_all", "run_load", "summarize"]
