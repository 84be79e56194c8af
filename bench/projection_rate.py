"""Is a batch-1 projection bound by memory or by its arithmetic? The same kernel timed on weights that stay in
cache and on weights streamed from memory.

    python -m bench.projection_rate [--repeats 2000]
    OMP_NUM_THREADS=1 python -m bench.projection_rate --types Q4_1,Q5_0,Q4_K [--shape 2048x1536]

For each precision, one row of x is projected back to back on: a layer's gate/up matrix (Q4_1, 1.1 MB: it
stays in the cores' L2); the layers' gate/up matrices stacked and repeated to at least twice the last-level
cache the machine reports, and at least 1 GiB (so that they stream from memory, as bench.backend_step's read
bandwidth does); the output head (Q8_0) repeated likewise. The median call, less the median call on an 8-row
matrix (the call's own cost), gives the rate the kernel reads its weights at; printed beside the read bandwidth
of a 1 GiB array measured in the same run. A kernel no faster with its weights in L2 than streamed from memory
is held back by its instructions, not by memory. (The fast precision multiplies Q8_0 exactly: its head row is
the exact kernel's.) Restarts itself with the backend's process defaults.

With --types, no model: one row of x against a random matrix of each type (gguf's quantization of normal
values; the K-quants, which gguf cannot quantize, random bytes with small float16 scales), in cache, in
weights a second of the process's CPU time (so that one thread's rate is the kernel's work, not a share of a
busy machine's clock), for each precision.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from backends.model.loader import load_model
from backends.model.quant import QuantMatrix
from backends.numpy_backend.native.matmul import NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from backends.numpy_backend.process_env import reexec_with_defaults
from bench.backend_step import read_bandwidth


def median_call(project: NativeMatmul, x: np.ndarray, w: QuantMatrix, repeats: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    for _ in range(20):
        project.project(x, w)
    times = []
    for _ in range(repeats):
        start = clock()
        project.project(x, w)
        times.append(clock() - start)
    return float(np.median(times))


# the float16 scales of a K-quant super-block: (byte offset, spread of the random values)
K_HALVES = {GGMLQuantizationType.Q4_K: ((0, 0.01), (2, 0.01)), GGMLQuantizationType.Q5_K: ((0, 0.005), (2, 0.01)),
            GGMLQuantizationType.Q6_K: ((208, 0.005),), GGMLQuantizationType.Q2_K: ((80, 0.02), (82, 0.01)),
            GGMLQuantizationType.Q3_K: ((108, 0.01),)}


def random_matrix(qtype: GGMLQuantizationType, rows: int, cols: int) -> QuantMatrix:
    """gguf's quantization of normal values; a K-quant's random bytes with finite small float16 scales."""
    rng = np.random.default_rng(0)
    if qtype not in K_HALVES:
        return QuantMatrix.quantize(rng.normal(0, 0.3, (rows, cols)).astype(np.float32), qtype)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, block_bytes), dtype=np.uint8)
    for at, spread in K_HALVES[qtype]:
        halves = rng.normal(0, spread, data.shape[:2]).astype(np.float16)
        data[..., at : at + 2] = halves.view(np.uint8).reshape(*data.shape[:2], 2)
    return QuantMatrix(qtype, (rows, cols), np.ascontiguousarray(data.reshape(rows, -1)))


def type_rates(names: str, shape: str, repeats: int) -> None:
    """Each type's batch-1 rate in cache, in Gweights per second of process time."""
    rows, cols = (int(v) for v in shape.split("x"))
    x = np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32)
    for precision in ("exact", "fast"):
        project = NativeMatmul(fast=precision == "fast")
        rates = []
        for name in names.split(","):
            w = random_matrix(GGMLQuantizationType[name], rows, cols)
            seconds = median_call(project, x, w, repeats, time.process_time)
            rates.append(f"{name} {rows * cols / seconds / 1e9:.1f}")
        print(f"{precision} ({project.tier.name}, {rows}x{cols}, Gweights/s): {', '.join(rates)}")


def last_level_cache_bytes() -> int:
    """The largest cache the first CPU reports (sysfs), 0 if none is readable."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
    return max(sizes, default=0)


def streamed(matrices: list[QuantMatrix], at_least: int) -> QuantMatrix:
    """The matrices stacked, and repeated until the whole holds at least `at_least` bytes."""
    once = QuantMatrix.stack(matrices)
    return QuantMatrix.stack([once] * -(-at_least // once.nbytes))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="calls timed on the cached matrices")
    parser.add_argument("--types", help="comma-separated GGUF types: their rates on random matrices, no model")
    parser.add_argument("--shape", default="2048x1536", help="with --types: the matrices' rows x columns")
    args = parser.parse_args(argv)
    reexec_with_defaults("bench.projection_rate")
    if args.types:
        type_rates(args.types, args.shape, args.repeats)
        return
    model = load_model(stored=STORED_TYPES)
    gate_up = [m for m in (layer.w_gate_up for layer in model.weights.layers) if isinstance(m, QuantMatrix)]
    head = model.weights.lm_head
    if not isinstance(head, QuantMatrix) or len(gate_up) != len(model.weights.layers):
        raise SystemExit("the default model's matrices are not kept as stored")
    cache = last_level_cache_bytes()
    big = max(2 * cache, 1 << 30)
    print(f"last-level cache {cache / 2**20:.0f} MiB; streamed cases at least {big / 2**30:.2f} GiB; read "
          f"bandwidth (1 GiB) {read_bandwidth() / 1e9:.1f} GB/s")
    cases = [("gate/up, one layer (in L2)", gate_up[0], args.repeats),
             ("gate/up, all layers (streamed)", streamed(gate_up, big), 7),
             ("output head (streamed)", streamed([head], big), 7)]
    x = np.random.default_rng(0).standard_normal((1, model.config.hidden_size)).astype(np.float32)
    for precision in ("exact", "fast"):
        project = NativeMatmul(fast=precision == "fast")
        eight_rows = QuantMatrix.of(gate_up[0].data[:8], gate_up[0].qtype, gate_up[0].shape[1])
        call = median_call(project, x, eight_rows, args.repeats)
        print(f"{precision}: a call's own cost {call * 1e6:.1f} us")
        for label, w, repeats in cases:
            seconds = median_call(project, x, w, repeats) - call
            print(f"  {label:<32} {w.qtype.name:<5} {w.nbytes / 1e6:7.1f} MB {seconds * 1e3:7.3f} ms "
                  f"{w.nbytes / seconds / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
