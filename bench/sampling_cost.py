"""What sampling costs a decode step on the CPU: backends/sampling.sample over a batch of random logits.

    python -m bench.sampling_cost [--rows 16] [--vocab 49152] [--repeats 50]

Prints the median milliseconds per call for greedy rows, temperature 1 (no filter), and temperature 1 with
top-p 0.9, with top-k 40, with min-p 0.05, and with the logprobs of the sampled token and the top 5, each for
the whole batch (the NumPy backend samples on the engine's thread while
the kernels' threads wait for the next step): NumPy's sampler alone, and with the C row sampler (sampling.c)
that the NumPy backend hands its temperature and min-p rows."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from backends.base import SamplingInputs
from backends.numpy_backend.native.sampler import NativeSampler
from backends.sampling import RowSampler, sample


def inputs(rows: int, temperature: float, top_p: float = 1.0, min_p: float = 0.0, top_k: int = 0,
           logprobs: int = -1) -> SamplingInputs:
    """logprobs >= 0: the sampled token's logprob and that many alternatives."""
    rng = np.random.default_rng(1)
    return SamplingInputs(np.full(rows, temperature, np.float32), np.full(rows, top_k, np.int32),
                          np.full(rows, top_p, np.float32), np.full(rows, min_p, np.float32),
                          rng.random(rows, dtype=np.float32), num_top_logprobs=max(logprobs, 0),
                          want_logprobs=logprobs >= 0)


def median_ms(logits: np.ndarray, params: SamplingInputs, repeats: int, row_sampler: RowSampler | None) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sample(np, logits, params, row_sampler)
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
             "top-p 0.9": inputs(args.rows, 1.0, top_p=0.9), "top-k 40": inputs(args.rows, 1.0, top_k=40),
             "min-p 0.05": inputs(args.rows, 1.0, min_p=0.05), "logprobs, top 5": inputs(args.rows, 1.0, logprobs=5)}
    native = NativeSampler()
    print(f"{args.rows} rows x {args.vocab} logits, ms per sample() call (median of {args.repeats}), "
          f"C sampler built for tier {native.tier.name}:")
    print(f"  {'':>16}  {'NumPy':>7}  {'with C':>7}")
    for name, params in cases.items():
        costs = [median_ms(logits, params, args.repeats, sampler) for sampler in (None, native)]
        print(f"  {name:>16}: {costs[0]:7.2f}  {costs[1]:7.2f}")


if __name__ == "__main__":
    main()
