"""What sampling costs a decode step on the CPU: backends/sampling.sample over a batch of random logits.

    python -m bench.sampling_cost [--rows 16] [--vocab 49152] [--repeats 50]

Prints the median milliseconds per call for greedy rows, temperature 1 (no filter), and temperature 1 with
top-p 0.9 and with min-p 0.05, each for the whole batch (the NumPy backend samples on the engine's thread while
the kernels' threads wait for the next step)."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from backends.base import SamplingInputs
from backends.sampling import sample


def inputs(rows: int, temperature: float, top_p: float = 1.0, min_p: float = 0.0) -> SamplingInputs:
    rng = np.random.default_rng(1)
    return SamplingInputs(np.full(rows, temperature, np.float32), np.zeros(rows, np.int32),
                          np.full(rows, top_p, np.float32), np.full(rows, min_p, np.float32),
                          rng.random(rows, dtype=np.float32))


def median_ms(logits: np.ndarray, params: SamplingInputs, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sample(np, logits, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    logits = np.random.default_rng(0).normal(0, 3, (args.rows, args.vocab)).astype(np.float32)
    cases = {"greedy": inputs(args.rows, 0.0), "temperature 1": inputs(args.rows, 1.0),
             "top-p 0.9": inputs(args.rows, 1.0, top_p=0.9), "min-p 0.05": inputs(args.rows, 1.0, min_p=0.05)}
    print(f"{args.rows} rows x {args.vocab} logits, ms per sample() call (median of {args.repeats}):")
    for name, params in cases.items():
        print(f"  {name:>14}: {median_ms(logits, params, args.repeats):7.2f}")


if __name__ == "__main__":
    main()
