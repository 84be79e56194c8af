"""The bench's command-line options and what they build: workload, load shapes, bounds, SLO."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from bench.loadgen.slo import Slo, parse_slo
from bench.loadgen.spec import Bounds, LoadShape
from bench.loadgen.sweep import Sweep, parse_sweep
from bench.loadgen.workloads import (
    DISTRIBUTIONS,
    ChatWorkload,
    FileWorkload,
    Lengths,
    RandomWorkload,
    SharedPrefixWorkload,
    Workload,
)

WORKLOADS = ("random", "file", "shared-prefix", "chat")
DEFAULT_CONCURRENCY = 16  # when neither --concurrency nor --rate is given
DEFAULT_PREFIX_LEN = {"shared-prefix": 1024, "chat": 0}


def add_bench_options(parser: argparse.ArgumentParser, model_option: bool = False) -> None:
    """Every option; `--model` only where the command can open a model's tokenizer (`model_option`)."""
    _target_options(parser.add_argument_group("target"), model_option)
    _load_options(parser.add_argument_group("load"))
    _workload_options(parser.add_argument_group("workload"))
    _result_options(parser.add_argument_group("results"))


def _target_options(g: argparse._ArgumentGroup, model_option: bool) -> None:
    g.add_argument("--base-url", metavar="URL",
                   help="the server's root URL (default: http://HOST:PORT from --host and --port)")
    g.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="the server's port (default 8000)")
    g.add_argument("--api-key", metavar="KEY", help="sent as a bearer token (default: none)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help='the requests\' "model" (default: the first model the server lists)')
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default completions)")
    g.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per request (default 600)")
    g.add_argument("--session-header", metavar="NAME",
                   help="send one id per session in this header, e.g. X-Session-Id for Envoy's session affinity "
                        "(every turn of a chat shares it; default: none)")
    if model_option:
        g.add_argument("--model", metavar="FILE", help="the GGUF model whose tokenizer counts tokens when a "
                                                     "server sends no usage (default: the installed model)")


def _load_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--concurrency", type=int, metavar="N",
                   help=f"closed loop: N clients (default {DEFAULT_CONCURRENCY}); with --rate: a cap on requests "
                        "in flight")
    g.add_argument("--rate", type=float, metavar="R", help="open loop: R arrivals/s (inf: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0, metavar="K",
                   help="gamma shape of the arrival gaps: 1 Poisson, < 1 bursty, > 1 regular (default 1)")
    g.add_argument("--num-requests", type=int, default=200, metavar="N",
                   help="measured requests (default 200; 0: no count bound, needs --duration)")
    g.add_argument("--duration", type=float, metavar="S", help="stop sending after S seconds")
    g.add_argument("--warmup", type=int, default=0, metavar="N", help="unmeasured requests first (default 0)")
    g.add_argument("--seed", type=int, default=0, help="prompts, lengths and arrivals (default 0)")
    g.add_argument("--sweep", metavar="KIND=V,V",
                   help="one run per value: concurrency=1,4,16,64 or rate=2,4,8 (replaces that option)")


def _workload_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--workload", choices=WORKLOADS, default="random", help="what to send (default random)")
    g.add_argument("--input-len", type=int, default=128, metavar="N",
                   help="prompt tokens (shared-prefix: the question after the prefix; chat: each user turn)")
    g.add_argument("--output-len", type=int, default=128, metavar="N", help="max_tokens (default 128)")
    g.add_argument("--lengths", choices=DISTRIBUTIONS, default="fixed",
                   help="fixed, or log-normal around the given lengths (a long tail)")
    g.add_argument("--length-sigma", type=float, default=1.0, metavar="S", help="log-normal sigma (default 1)")
    g.add_argument("--dataset", metavar="FILE", help="file workload: JSONL of {prompt} or {messages}")
    g.add_argument("--num-prefixes", type=int, default=4, metavar="N", help="shared-prefix: system prompts")
    g.add_argument("--prefix-len", type=int, metavar="N",
                   help="shared-prefix: system prompt tokens (default 1024); chat: each conversation's (default 0)")
    g.add_argument("--turns", type=int, default=4, metavar="N", help="chat: user turns per conversation")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_tokens (default on)")


def _result_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--slo", metavar="KEY=V,...", help="goodput objectives, e.g. ttft=500ms,tpot=50ms,e2e=10s")
    g.add_argument("--out", metavar="FILE", help="write the results as JSON")
    g.add_argument("--plot", metavar="FILE", help="PNG of the throughput/latency frontier (default with --sweep "
                                                  "and --out: next to the JSON)")
    g.add_argument("--save-requests", action="store_true", help="include each request's figures in the JSON")
    g.add_argument("--check-metrics", action="store_true",
                   help="compare TTFT/ITL/TPOT/E2E with the server's /metrics histograms for the same run")
    g.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


@dataclass(frozen=True)
class Plan:
    """What the options ask for."""

    sweep: Sweep | None
    shapes: list[LoadShape]
    bounds: Bounds
    slo: Slo | None
    workload: Workload


def plan_of(args: argparse.Namespace) -> Plan:
    """Raises ValueError for an option that does not parse, OSError for a dataset that cannot be read."""
    sweep = sweep_of(args)
    return Plan(sweep, shapes_of(args, sweep), bounds_of(args), slo_of(args), workload_of(args))


def workload_of(args: argparse.Namespace) -> Workload:
    dist, sigma = args.lengths, args.length_sigma
    inp, out = Lengths(args.input_len, dist, sigma), Lengths(args.output_len, dist, sigma)
    prefix_len = args.prefix_len if args.prefix_len is not None else DEFAULT_PREFIX_LEN.get(args.workload, 0)
    if args.workload == "file":
        if not args.dataset:
            raise ValueError("--workload file needs --dataset FILE")
        return FileWorkload.load(args.dataset, args.output_len, args.ignore_eos, args.seed)
    if args.workload == "shared-prefix":
        return SharedPrefixWorkload(args.num_prefixes, prefix_len, inp, out, args.ignore_eos, args.seed)
    if args.workload == "chat":
        return ChatWorkload(args.turns, inp, out, prefix_len, args.ignore_eos, args.seed)
    return RandomWorkload(inp, out, args.ignore_eos, args.seed)


def sweep_of(args: argparse.Namespace) -> Sweep | None:
    return parse_sweep(args.sweep) if args.sweep else None


def shapes_of(args: argparse.Namespace, sweep: Sweep | None) -> list[LoadShape]:
    concurrency = args.concurrency
    if concurrency is None and args.rate is None and (sweep is None or sweep.kind == "concurrency"):
        concurrency = DEFAULT_CONCURRENCY
    rate = args.rate if sweep is None or sweep.kind == "concurrency" else math.inf  # replaced by the sweep
    base = LoadShape(concurrency, rate, args.burstiness, args.seed)
    return sweep.shapes(base) if sweep is not None else [base]


def bounds_of(args: argparse.Namespace) -> Bounds:
    return Bounds(args.num_requests or None, args.duration, args.warmup)


def slo_of(args: argparse.Namespace) -> Slo | None:
    return parse_slo(args.slo) if args.slo else None


def workload_description(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("workload", "input_len", "output_len", "lengths", "length_sigma", "dataset",
            "num_prefixes", "prefix_len", "turns", "ignore_eos", "seed")
    return {k: getattr(args, k) for k in keys}
