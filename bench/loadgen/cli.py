"""`pagedserve bench`: benchmark any OpenAI-compatible server (this one, or vLLM, llama.cpp's server, ...).

Of the configuration flags every pagedserve command accepts, bench reads the connection ones: --host and
--port (where the server listens), --api-key (its first key is sent) and --served-model-name (the request's
"model"; default: the first model the server lists). --model names the GGUF whose tokenizer counts output
tokens when a server sends no usage. The scheduler, KV and backend flags configure a server, not this client,
and are ignored with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.loadgen.args import (
    add_bench_options,
    bounds_of,
    shapes_of,
    slo_of,
    sweep_of,
    workload_description,
    workload_of,
)
from bench.loadgen.measure import Measurement, Options, measure_all
from bench.loadgen.plot import plot_frontier
from bench.loadgen.progress import LineProgress, NoProgress
from bench.loadgen.report import format_cross_check, format_summary, write_json
from bench.loadgen.spec import Target
from service.cli import Command
from service.config_load import flags_of

CONNECTION_FLAGS = ("host", "port", "api_key", "served_model_name", "model")
EXIT_USAGE, EXIT_ALL_FAILED = 2, 1


class LazyTokenCounter:
    """Counts tokens with the model's tokenizer, loaded on first use (only when a server sends no usage)."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self._encode: Any = None

    def __call__(self, text: str) -> int:
        if self._encode is None:
            from backends.model.loader import open_model  # noqa: PLC0415  (only if ever needed)

            self._encode = open_model(self.model)[1].tokenizer.encode
        return len(self._encode(text))


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Configuration flags: bench reads --host, --port, --api-key, --served-model-name and --model "
                     "(tokenizer for servers that send no usage); the others configure a server and are ignored.")
    add_bench_options(parser)


def _run(args: argparse.Namespace) -> int:
    try:
        sweep = sweep_of(args)
        shapes, bounds, slo, workload = shapes_of(args, sweep), bounds_of(args), slo_of(args), workload_of(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    flags = flags_of(args)
    _note_ignored(flags)
    target = asyncio.run(_target(args, flags))
    progress = NoProgress() if args.no_progress else LineProgress()
    options = Options(slo, LazyTokenCounter(flags.get("model")), args.check_metrics, progress)
    results = asyncio.run(measure_all(target, workload, shapes, bounds, options))
    _print(results)
    labels = sweep.labels() if sweep is not None else [shapes[0].label()]
    _save(args, target, labels, results)
    return 0 if any(m.summary.completed for m in results) else EXIT_ALL_FAILED


def _note_ignored(flags: dict[str, Any]) -> None:
    ignored = sorted(name for name in flags if name not in CONNECTION_FLAGS)
    if ignored:
        names = ", ".join("--" + n.replace("_", "-") for n in ignored)
        print(f"note: server settings ignored by bench: {names}", file=sys.stderr)


async def _target(args: argparse.Namespace, flags: dict[str, Any]) -> Target:
    base = args.base_url or f"http://{flags.get('host', '127.0.0.1')}:{flags.get('port', 8000)}"
    keys = [k.strip() for item in flags.get("api_key") or () for k in str(item).split(",") if k.strip()]
    key = keys[0] if keys else None
    model = flags.get("served_model_name") or await _first_model(base, key)
    return Target(base, args.endpoint, model, key, args.timeout)


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
                             "cross_check": m.cross_check}
    if with_requests:
        point["requests"] = m.requests
    return point


BENCH = Command("bench", "benchmark an OpenAI-compatible server (streaming load, latency percentiles, sweeps)",
                _configure, _run)
