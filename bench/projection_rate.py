"""Is a batch-1 projection bound by memory or by its arithmetic? The same kernel timed on weights that stay in
cache and on weights streamed from memory.

    python -m bench.projection_rate [--repeats 2000]

For each precision and each of the default model's stored types (a layer's gate/up matrix, Q4_1, 1.1 MB, fits
the cores' L2; the 30 layers' gate/up matrices stacked, 33 MB, do not; the output head, Q8_0, 30 MB), one row of
x is projected back to back: the median call, less the median call on an 8-row matrix (the call's own cost),
gives the rate the kernel reads its weights at. A rate no higher in cache than from memory means the kernel's
instructions, not the bus, set its speed. Restarts itself with the backend's process defaults.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from backends.model.loader import load_model
from backends.model.quant import QuantMatrix
from backends.numpy_backend.native.matmul import NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from backends.numpy_backend.process_env import reexec_with_defaults


def median_call(project: NativeMatmul, x: np.ndarray, w: QuantMatrix, repeats: int) -> float:
    for _ in range(20):
        project.project(x, w)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        project.project(x, w)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def stacked(matrices: list[QuantMatrix]) -> QuantMatrix:
    rows = sum(m.shape[0] for m in matrices)
    return QuantMatrix(matrices[0].qtype, (rows, matrices[0].shape[1]), np.concatenate([m.data for m in matrices]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="calls timed on the cached matrices")
    args = parser.parse_args(argv)
    reexec_with_defaults("bench.projection_rate")
    model = load_model(stored=STORED_TYPES)
    gate_up = [m for m in (layer.w_gate_up for layer in model.weights.layers) if isinstance(m, QuantMatrix)]
    head = model.weights.lm_head
    if not isinstance(head, QuantMatrix) or len(gate_up) != len(model.weights.layers):
        raise SystemExit("the default model's matrices are not kept as stored")
    cases = [("gate/up, one layer (in cache)", gate_up[0], args.repeats),
             ("gate/up, 30 layers (from memory)", stacked(gate_up), max(args.repeats // 20, 5)),
             ("output head (from memory)", head, max(args.repeats // 20, 5))]
    x = np.random.default_rng(0).standard_normal((1, model.config.hidden_size)).astype(np.float32)
    for precision in ("exact", "fast"):
        project = NativeMatmul(fast=precision == "fast")
        call = median_call(project, x, QuantMatrix(gate_up[0].qtype, (8, gate_up[0].shape[1]),
                                                   np.ascontiguousarray(gate_up[0].data[:8])), args.repeats)
        print(f"{precision}: a call's own cost {call * 1e6:.1f} us")
        for label, w, repeats in cases:
            seconds = median_call(project, x, w, repeats) - call
            print(f"  {label:<34} {w.qtype.name:<5} {w.nbytes / 1e6:6.1f} MB {seconds * 1e3:7.3f} ms "
                  f"{w.nbytes / seconds / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
