"""Where a decode step's CPU time goes, by stage, on each CPU tier: the fused step's projections, attention and the
rest (fused_step.c's own timers), and the output head apart:

    OMP_NUM_THREADS=1 python -m bench.step_stages [--tiers amx,avx2] [--precision fast] [--batches 1,16]
                                                  [--steps 8] [--model PATH]

CPU time, the medians of `--steps` steps after two untimed ones, 256-token contexts, weights as the GGUF stores
them (bench.tier_step's whole steps, split). Run it with OMP_NUM_THREADS=1: with more threads, the stages' timers
count wall time and the step's CPU time counts the threads' spin-waits.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import CpuInfo
from backends.numpy_backend.native.fused_step import STAGES
from backends.numpy_backend.native.weights import STORED_TYPES
from bench.backend_step import BLOCK, CONTEXT, AttentionTimer, cpu_model, decode_step


class HeadTimer:
    """Wraps the forward's logits (final norm and output head) and adds up their CPU seconds."""

    def __init__(self, forward: Any) -> None:
        self.inner, self.seconds = forward.logits, 0.0
        forward.logits = self

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        start = time.process_time()
        out = self.inner(hidden)
        self.seconds += time.process_time() - start
        return out


def stage_ms(backend: NumpyBackend, batch: int, steps: int) -> dict[str, float]:
    """Median CPU ms of the step, its fused stages and its head."""
    timer, head = AttentionTimer(), HeadTimer(backend.forward)
    for _ in range(2):
        decode_step(backend, batch, timer)
    rows: list[list[float]] = []
    for _ in range(steps):
        head.seconds, start = 0.0, time.process_time()
        decode_step(backend, batch, timer)
        fused = backend.forward.fused_step
        stages = list(fused.last_seconds) if fused is not None else [0.0] * len(STAGES)
        rows.append([time.process_time() - start, *stages, head.seconds])
    names = ("step", *STAGES, "head")
    return {name: 1e3 * statistics.median(r[i] for r in rows) for i, name in enumerate(names)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default=",".join(t.name for t in CpuInfo.of_this_host().runnable()))
    parser.add_argument("--precision", default="fast", choices=("exact", "fast"))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    args = parser.parse_args(argv)
    model = load_model(args.model, stored=STORED_TYPES)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{cpu_model()}; {model.files.path.name}, {args.precision} precision; CPU ms, medians")
    print(f"{'tier':>12} {'batch':>5} {'step':>8} " + " ".join(f"{n:>11}" for n in (*STAGES, "head")))
    for tier in args.tiers.split(","):
        backend = NumpyBackend(model, "native", args.precision, "float32", tier)
        backend.init_cache(max(batches) * (CONTEXT // BLOCK + 1), BLOCK)
        for batch in batches:
            ms = stage_ms(backend, batch, args.steps)
            print(f"{tier:>12} {batch:>5} {ms['step']:>8.1f} " + " ".join(f"{ms[n]:>11.1f}" for n in (*STAGES, "head")))


if __name__ == "__main__":
    main()
