"""NumPy backend step benchmark: memory bandwidth, prefill throughput, decode step time by batch size.

    python -m bench.backend_step [--repeats 9]

Prints the machine's copy bandwidth, the time to stream the float32 weights once at that bandwidth (the
floor for a batch-1 decode step), prefill tokens/s at 512 tokens, decode step time and aggregate tokens/s at
batch 1, 8, 32 and 64 with 256-token contexts, the share of each step spent in attention (and, for steps
the fused C step ran, the time of its projections, attention and the rest), and the BLAS library and kernel
that ran. It restarts itself with the NumPy backend's process defaults
(backends/numpy_backend/process_env.py: OpenBLAS workers stop spinning sooner) unless they are set. To
benchmark the fastest kernel on a machine that pins OPENBLAS_CORETYPE, unset it (and OPENBLAS_L2_SIZE) for
this command only: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ...`.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

import backends.numpy_backend.model as model_module
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.fused_step import STAGES
from backends.numpy_backend.native.matmul import MAX_ROWS
from backends.numpy_backend.process_env import DEFAULTS, reexec_with_defaults

BLOCK = 16
CONTEXT = 256
BATCHES = (1, 8, 32, 64)


def copy_bandwidth(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Bytes per second moved by a large array copy (read + write)."""
    src = np.ones(num_bytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * num_bytes / best


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class AttentionTimer:
    """Wraps the model's paged_attention to add up its time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._inner = model_module.paged_attention

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = self._inner(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return out


def prefill_rate(backend: NumpyBackend, tokens: int = 512, repeats: int = 2) -> float:
    ids = list(np.random.default_rng(0).integers(20, 40000, tokens))
    seconds = []
    for _ in range(repeats):
        batch = make_batch([SeqState(blocks=list(range(tokens // BLOCK)))], [ids], BLOCK)
        seconds.append(_timed(functools.partial(backend.compute_logits, batch)))
    return tokens / min(seconds)


@dataclass(frozen=True)
class StepTiming:
    """One decode step: its seconds, and the seconds of its parts where they were timed (the fused C step
    times its projections, attention and the rest; on the per-layer path only attention is timed)."""

    seconds: float
    parts: dict[str, float]

    @property
    def attention_share(self) -> float:
        return self.parts.get("attention", 0.0) / self.seconds


def decode_step(backend: NumpyBackend, batch: int, timer: AttentionTimer) -> StepTiming:
    """One decode step with `batch` sequences at CONTEXT tokens."""
    per_seq = CONTEXT // BLOCK + 1
    seqs = [SeqState(blocks=list(range(i * per_seq, (i + 1) * per_seq)), tokens=[7] * (CONTEXT - 1))
            for i in range(batch)]
    timer.seconds = 0.0
    fused = backend.forward.fused_step
    if fused is not None:
        fused.last_seconds[:] = 0.0
    step = _timed(lambda: backend.execute(make_batch(seqs, [[11]] * batch, BLOCK)))
    if fused is not None and fused.last_seconds.any():
        return StepTiming(step, dict(zip(STAGES, (float(v) for v in fused.last_seconds), strict=True)))
    return StepTiming(step, {"attention": timer.seconds})


def decode_table(backend: NumpyBackend, repeats: int, timer: AttentionTimer) -> dict[int, StepTiming]:
    """Medians per batch size (of the step and of each part). The batch sizes take turns, round after round,
    so a host that speeds up or slows down during the run moves all of them alike (not one batch size)."""
    runs: dict[int, list[StepTiming]] = {batch: [] for batch in BATCHES}
    for _ in range(repeats):
        for batch in BATCHES:
            runs[batch].append(decode_step(backend, batch, timer))
    return {batch: StepTiming(statistics.median(t.seconds for t in r),
                              {part: statistics.median(t.parts.get(part, 0.0) for t in r) for part in r[0].parts})
            for batch, r in runs.items()}


def blas_description() -> str:
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(f"{i['internal_api']} {i.get('version')} kernel={i.get('architecture')} "
                     f"threads={i['num_threads']}" for i in infos) or "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    reexec_with_defaults("bench.backend_step")
    model = load_model()
    backend = NumpyBackend(model)
    backend.init_cache(max(BATCHES) * (CONTEXT // BLOCK + 1), BLOCK)
    timer = AttentionTimer()
    model_module.paged_attention = timer
    bandwidth = copy_bandwidth()
    streamed = _streamed_bytes(model)
    floor = streamed / bandwidth
    env = {name: os.environ.get(name, "(unset)") for name in ("OPENBLAS_CORETYPE", *DEFAULTS)}
    print(f"BLAS: {blas_description()}; " + " ".join(f"{k}={v}" for k, v in env.items()))
    fused = backend.forward.fused_step
    print(f"decode attention: {getattr(backend.forward.decode_attention, '__qualname__', '?')}; projections: "
          f"{getattr(backend.forward.project, '__qualname__', '?')} (C kernel up to {MAX_ROWS} rows, then BLAS); "
          f"fused C step: {f'up to {fused.max_rows} rows' if fused else 'off'}")
    print(f"model load: {model.load_seconds:.2f} s; weights streamed per decode step: {streamed / 1e6:.0f} MB")
    print(f"copy bandwidth: {bandwidth / 1e9:.2f} GB/s -> weight-streaming time {floor * 1e3:.1f} ms")
    print(f"prefill at 512 tokens: {prefill_rate(backend):.0f} tokens/s")
    print(f"{'batch':>5} {'step ms':>9} {'tokens/s':>9} {'x batch1':>9} {'attn %':>7} {'step/floor':>10}   "
          "fused step, ms: projections attention other (the rest of the step: output head, sampling, Python)")
    base = None
    for batch, timing in decode_table(backend, args.repeats, timer).items():
        rate = batch / timing.seconds
        base = base or rate
        parts = " ".join(f"{timing.parts[p] * 1e3:>6.1f}" for p in STAGES) if len(timing.parts) > 1 else "-"
        print(f"{batch:>5} {timing.seconds * 1e3:>9.1f} {rate:>9.1f} {rate / base:>9.2f} "
              f"{timing.attention_share * 100:>7.1f} {timing.seconds / floor:>10.2f}   {parts}")


def _streamed_bytes(model: Any) -> int:
    """Bytes a decode step must read: every layer matrix and the output head (not the embedding rows)."""
    w = model.weights
    return int(sum(a.nbytes for layer in w.layers for a in vars(layer).values()) + w.lm_head.nbytes
               + w.final_norm.nbytes)


if __name__ == "__main__":
    main()
