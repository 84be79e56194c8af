"""A load generator for OpenAI-compatible servers: a pure HTTP client (it imports nothing of this project).

    spec.py       what to send (Target, RequestSpec, sessions) and how (LoadShape, Bounds)
    workloads.py  seeded random prompts, a JSONL file, shared system prompts, multi-turn chat
    arrivals.py   the open-loop arrival process (Poisson, or gamma with a burstiness factor)
    client.py     one streaming request, timed chunk by chunk (sse.py parses the stream)
    runner.py     drives a workload at a fixed concurrency or an arrival rate, within count and time bounds
    metrics.py    TTFT, TPOT, ITL, E2E, throughputs and goodput (vLLM's definitions)
    sweep.py      one run per concurrency or rate; plot.py draws the throughput/latency frontier
    promcheck.py  the server's Prometheus histograms against the bench's own samples
    cli.py        `pagedserve bench` (the only module here that may use the rest of the project)
"""

from bench.loadgen.metrics import Stats, Summary, summarize
from bench.loadgen.runner import RunRecord, run_load
from bench.loadgen.spec import Bounds, LoadShape, RequestSpec, Target
from bench.loadgen.workloads import Workload

__all__ = ["Bounds", "LoadShape", "RequestSpec", "RunRecord", "Stats", "Summary", "Target", "Workload", "run_load",
           "summarize"]
