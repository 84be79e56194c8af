"""The NumPy backend's decode step on each CPU tier this machine runs, in CPU time on one thread:

    OMP_NUM_THREADS=1 python -m bench.tier_step [--tiers generic,avx2] [--batches 1,8] [--steps 20] [--model PATH]
                                                [--modes float32,gguf,gguf-fast]

For each tier (cpu_tiers.py; default: every one the CPU runs) and each mode (float32 weights, the GGUF's own,
and the GGUF's in the fast precision), the median process CPU time of a decode step at each batch size with
256-token contexts, and the gguf / float32 ratio. CPU time on one thread is what the kernels cost, whatever
else the host runs, so the figures compare tiers on a shared machine where wall times swing; a step's wall time
on several cores is bounded below by it divided by the cores, and by the bytes it streams (bench.backend_step
measures both). Run it with OMP_NUM_THREADS=1: with more, the threads' spin-waits count as CPU time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import CpuInfo
from backends.numpy_backend.native.weights import STORED_TYPES
from bench.backend_step import BATCHES, BLOCK, CONTEXT, MODES, AttentionTimer, cpu_model, decode_step, weights_rss_mib

TIER_MODES = ("float32", "gguf", "gguf-fast")  # bench.backend_step's modes over a float32 KV cache


def step_cpu_ms(backend: NumpyBackend, batch: int, steps: int, timer: AttentionTimer) -> float:
    """Median CPU milliseconds of a decode step, after two untimed ones."""
    for _ in range(2):
        decode_step(backend, batch, timer)
    times = []
    for _ in range(steps):
        start = time.process_time()
        decode_step(backend, batch, timer)
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def tier_rows(models: dict[str, LoadedModel], tier: str, batches: list[int], steps: int,
              modes: list[str]) -> dict[str, list[float]]:
    timer, rows = AttentionTimer(), {}
    for mode in modes:
        weights, precision, kv_dtype = MODES[mode]
        backend = NumpyBackend(models[weights], "native", precision, kv_dtype, tier)
        backend.init_cache(max(batches) * (CONTEXT // BLOCK + 1), BLOCK)
        rows[mode] = [step_cpu_ms(backend, batch, steps, timer) for batch in batches]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default=",".join(t.name for t in CpuInfo.of_this_host().runnable()))
    parser.add_argument("--batches", default="1,8", help=f"of {BATCHES} or any")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per tier, mode and batch")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    parser.add_argument("--modes", default=",".join(TIER_MODES), help="of " + ", ".join(TIER_MODES))
    args = parser.parse_args(argv)
    batches, modes = [int(b) for b in args.batches.split(",")], args.modes.split(",")
    if unknown := set(modes) - set(TIER_MODES):
        parser.error(f"--modes: {', '.join(sorted(unknown))} not of {', '.join(TIER_MODES)}")
    print(f"{cpu_model()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    needed = {MODES[mode][0] for mode in modes}
    models: dict[str, LoadedModel] = {w: load_model(args.model, stored=STORED_TYPES if w == "gguf" else ())
                                      for w in ("gguf", "float32") if w in needed}
    rss = {weights: weights_rss_mib(weights, args.model) for weights in models}
    print(f"model: {next(iter(models.values())).files.path.name}; resident after load (a fresh process, KV pool "
          "excluded): " + ", ".join(f"{w} {mib:.0f} MiB" for w, mib in rss.items()))
    ratio_title = "  gguf / float32" if "float32" in modes else ""
    print(f"{'tier':>12} {'mode':>10} " + " ".join(f"{f'batch {b} ms':>12}" for b in batches) + ratio_title)
    for tier in args.tiers.split(","):
        rows = tier_rows(models, tier, batches, args.steps, modes)
        for mode, cells in rows.items():
            print(f"{tier:>12} {mode:>10} " + " ".join(f"{c:>12.1f}" for c in cells) + _ratios(cells, rows))


def _ratios(cells: list[float], rows: dict[str, list[float]]) -> str:
    """Each cell over float32's, when float32 ran."""
    if "float32" not in rows:
        return ""
    return "  " + " ".join(f"{c / f:.2f}" for c, f in zip(cells, rows["float32"], strict=True))


if __name__ == "__main__":
    main()
