"""The load generator's command: benchmark any OpenAI-compatible server (this one, or vLLM, llama.cpp's server,
...). `python -m bench.loadgen` runs it as it is; `pagedserve bench` (bench/bench_cmd.py) runs it with a
tokenizer for servers that send no usage. It takes only its own flags and reads no server configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.loadgen.args import Plan, add_bench_options, bounds_of, plan_of, workload_description
from bench.loadgen.measure import Measurement, Options, measure_all
from bench.loadgen.metrics import TokenCounter
from bench.loadgen.plot import plot_frontier
from bench.loadgen.progress import LineProgress, NoProgress
from bench.loadgen.report import format_cross_check, format_summary, write_json
from bench.loadgen.spec import Target
from bench.loadgen.speculation import format_speculation

DESCRIPTION = "benchmark an OpenAI-compatible server (streaming load, latency percentiles, sweeps)"
EXIT_ALL_FAILED, EXIT_USAGE = 1, 2
OpenTokenizer = Callable[[str | None], TokenCounter]  # --model's path (None: not given) -> a token counter


def build_parser(prog: str | None = None, description: str = DESCRIPTION, model_option: bool = False
                 ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_bench_options(parser, model_option)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None, description: str = DESCRIPTION,
         open_tokenizer: OpenTokenizer | None = None) -> int:
    """A bad option value is a usage error (this command's usage, exit 2); `open_tokenizer` adds `--model`."""
    parser = build_parser(prog, description, open_tokenizer is not None)
    args = parser.parse_args(argv)
    count = open_tokenizer(args.model) if open_tokenizer is not None else None
    try:
        return _run(args, _plan(parser, args), count)
    except OSError as exc:  # --dataset not readable, --out or --plot not writable
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _plan(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    try:
        return plan_of(args)
    except ValueError as exc:
        parser.error(str(exc))  # exits


def _run(args: argparse.Namespace, plan: Plan, count_tokens: TokenCounter | None) -> int:
    target = asyncio.run(_target(args))
    progress = NoProgress() if args.no_progress else LineProgress()
    options = Options(plan.slo, count_tokens, args.check_metrics, progress)
    results = asyncio.run(measure_all(target, plan.workload, plan.shapes, plan.bounds, options))
    _print(results)
    labels = plan.sweep.labels() if plan.sweep is not None else [plan.shapes[0].label()]
    _save(args, target, labels, results)
    return 0 if any(m.summary.completed for m in results) else EXIT_ALL_FAILED


async def _target(args: argparse.Namespace) -> Target:
    base = args.base_url or f"http://{args.host}:{args.port}"
    model = args.served_model_name or await _first_model(base, args.api_key)
    return Target(base, args.endpoint, model, args.api_key, args.timeout, args.session_header)


async def _first_model(base_url: str, api_key: str | None) -> str | None:
    """The first id of GET /v1/models; None (the request omits "model") when the server does not say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, \
                http.get(base_url.rstrip("/") + "/v1/models", headers=headers) as resp:
            data = await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    return str(models[0]["id"]) if models and isinstance(models[0], dict) and "id" in models[0] else None


def _print(results: Sequence[Measurement]) -> None:
    for m in results:
        print(format_summary(m.summary))
        if m.speculation is not None:
            print(format_speculation(m.speculation))
        if m.cross_check is not None:
            print(format_cross_check(m.cross_check))


def _save(args: argparse.Namespace, target: Target, labels: list[str], results: Sequence[Measurement]) -> None:
    if args.out:
        payload = {
            "target": {"base_url": target.base_url, "endpoint": target.endpoint, "model": target.model},
            "workload": workload_description(args),
            "bounds": bounds_of(args),
            "points": [_point(label, m, args.save_requests) for label, m in zip(labels, results, strict=True)],
        }
        print(f"results: {write_json(args.out, payload)}", file=sys.stderr)
    plot = args.plot or (str(Path(args.out).with_suffix(".png")) if args.out and args.sweep else None)
    if plot:
        title = f"{target.base_url} {target.endpoint}, {args.workload} workload"
        series = {args.sweep or "run": [(label, m.summary) for label, m in zip(labels, results, strict=True)]}
        print(f"plot: {plot_frontier(series, plot, title)}", file=sys.stderr)


def _point(label: str, m: Measurement, with_requests: bool) -> dict[str, Any]:
    point: dict[str, Any] = {"label": label, "shape": m.record.shape, "summary": m.summary,
                             "cross_check": m.cross_check, "speculation": m.speculation}
    if with_requests:
        point["requests"] = m.requests
    return point
