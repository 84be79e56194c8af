"""NumPy backend step benchmark: memory bandwidth, prefill throughput, decode step time by batch size, for the
weights dequantized to float32 and kept as the GGUF stores them (exact and fast precision; each also over a
float16 KV cache, "-kv16"), side by side.

    python -m bench.backend_step [--repeats 9] [--modes float32,gguf,gguf-fast,gguf-kv16,gguf-fast-kv16]
                                 [--warm-ms 150] [--steps 3] [--cpu-isa auto] [--model GGUF]

Prints the CPU and the tier its C kernels were built for (`--cpu-isa` forces one, as the server's setting
does); the machine's copy and read bandwidth; per mode, the bytes a decode step streams and the time to stream
them once at the read bandwidth (the floor for a batch-1 decode step) and the resident memory the weights take
(measured in a fresh process); prefill tokens/s at 512 tokens; decode step time and aggregate tokens/s at
batch 1, 8, 32 and 64 with 256-token contexts, every mode and batch size taking turns round after round, with
the share of each step spent in attention (and, for steps the fused C step ran, the time of its projections,
attention and the rest). A turn runs steps back to back, as a server does at a steady load: it times its first
step, runs more for `--warm-ms`, then times `--steps` more, whose median the tables give, with the first steps'
median beside them ("first ms"). On the shared 2-vCPU VM of docs/PERFORMANCE.md, a step after another mode's
work, or after the cores idled, is slower, and its successors come down over tens of milliseconds of steps (a
ramp in time, not in steps: a turn's second step is not yet steady). Then the scheduler's step-cost model
(scheduler/step_cost.py) fitted on each mode's steps; and the BLAS library and kernels that ran. It restarts
itself with the NumPy backend's process defaults (backends/numpy_backend/process_env.py: OpenBLAS workers stop
spinning sooner) unless they are set. To benchmark the fastest kernel on a machine that pins OPENBLAS_CORETYPE,
unset it (and OPENBLAS_L2_SIZE) for this command only: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ...`.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

import backends.numpy_backend.model as model_module
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import AUTO, CHOICES, CpuInfo, CpuTier, describe
from backends.numpy_backend.native.fused_step import STAGES
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from backends.numpy_backend.process_env import DEFAULTS, reexec_with_defaults
from backends.step_shape import FEATURES, StepShape
from scheduler.step_cost import fit

BLOCK = 16
CONTEXT = 256
BATCHES = (1, 8, 32, 64)
PREFILL = 512


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


def prefill_rate(backend: NumpyBackend, tokens: int = PREFILL, repeats: int = 2, per_layer: bool = False) -> float:
    """Tokens per second of one prompt's prefill; per_layer: on the per-layer path even where the fused step
    would take it."""
    ids = list(np.random.default_rng(0).integers(20, 40000, tokens))
    seconds, fused = [], backend.forward.fused_step
    if per_layer:
        backend.forward.fused_step = None
    try:
        for _ in range(repeats):
            batch = make_batch([SeqState(blocks=list(range(tokens // BLOCK)))], [ids], BLOCK)
            seconds.append(_timed(functools.partial(backend.compute_logits, batch)))
    finally:
        backend.forward.fused_step = fused
    return tokens / min(seconds)


def fused_rows(mode: Mode) -> str:
    fused = mode.backend.forward.fused_step
    return f"{mode.name} {f'up to {fused.max_rows} rows' if fused else 'off'}"


def prefill_note(backend: NumpyBackend, rate: float) -> str:
    """The prefill rate, and the per-layer path's beside it when the fused step takes the whole prompt."""
    fused = backend.forward.fused_step
    if fused is None or not fused.fits(PREFILL):
        return f"{rate:.0f} tokens/s"
    return f"{rate:.0f} tokens/s fused (per-layer path: {prefill_rate(backend, per_layer=True):.0f})"


@dataclass(frozen=True)
class StepTiming:
    """One decode step: its seconds, and the seconds of its parts where they were timed (the fused C step
    times its projections, attention and the rest; on the per-layer path only attention is timed)."""

    seconds: float
    parts: dict[str, float]
    shape: StepShape

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
    step_batch = make_batch(seqs, [[11]] * batch, BLOCK)  # the scheduler's work, not the backend's: untimed
    step = _timed(lambda: backend.execute(step_batch))
    if fused is not None and fused.last_seconds.any():
        parts = dict(zip(STAGES, (float(v) for v in fused.last_seconds), strict=True))
        return StepTiming(step, parts, step_batch.shape())
    return StepTiming(step, {"attention": timer.seconds}, step_batch.shape())


def blas_description() -> str:
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(f"{i['internal_api']} {i.get('version')} kernel={i.get('architecture')} "
                     f"threads={i['num_threads']}" for i in infos) or "unknown"


@dataclass(frozen=True)
class Mode:
    name: str
    backend: NumpyBackend
    streamed: int  # bytes a decode step reads: the layer matrices and the output head


# name -> weights, CPU precision, KV cache dtype
MODES = {"float32": ("float32", "exact", "float32"), "gguf": ("gguf", "exact", "float32"),
         "gguf-fast": ("gguf", "fast", "float32"), "gguf-kv16": ("gguf", "exact", "float16"),
         "gguf-fast-kv16": ("gguf", "fast", "float16"), "gguf-fast-stored": ("gguf", "fast", "float32")}
DEFAULT_MODES = ("float32", "gguf", "gguf-fast", "gguf-kv16", "gguf-fast-kv16")
STORED_Q8 = frozenset({"gguf-fast-stored"})  # Q8_0 left as stored, not regrouped (grouped_q8.py): the A/B


def build_modes(names: list[str], cpu_isa: str, model: str | None = None) -> list[Mode]:
    models = {w: load_model(model, stored=STORED_TYPES if w == "gguf" else ()) for w in {MODES[n][0] for n in names}}
    modes = []
    for name in names:
        weights, precision, kv_dtype = MODES[name]
        backend = NumpyBackend(models[weights], "auto", precision, kv_dtype, cpu_isa, name not in STORED_Q8)
        backend.init_cache(max(BATCHES) * (CONTEXT // BLOCK + 1), BLOCK)
        modes.append(Mode(name, backend, models[weights].weights.streamed_bytes))
    return modes


def cpu_model() -> str:
    """The CPU's model name and logical cores, and the tiers it runs."""
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo_lines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    return f"CPU: {model}, {os.cpu_count()} logical cores, runs tiers {describe(CpuInfo.of_this_host().runnable())}"


def cpu_line(tier: CpuTier | None, wanted: str) -> str:
    """The CPU and the tier the kernels ran: the figures below hold for this tier."""
    how = "forced" if wanted != AUTO else "the highest it runs"
    ran = f"tier {tier.name} ({tier.summary}; {how})" if tier is not None else "no C kernels"
    return f"{cpu_model()}; kernels built for {ran}"


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def read_bandwidth(num_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second read by sums over a large array, one slice per core at once (what a decode step's
    weight stream is: the kernels read on every core; one core alone reads about half as fast on some hosts)."""
    slices = np.array_split(np.ones(num_bytes // 4, np.float32), os.cpu_count() or 1)
    with ThreadPoolExecutor(len(slices)) as pool:  # NumPy's reductions release the GIL
        return num_bytes / min(_timed(lambda: list(pool.map(np.add.reduce, slices))) for _ in range(repeats))


def weights_rss_mib(weights: str, model: str | None = None) -> float:
    """Resident memory a model's load adds to a fresh process (its weights, tokenizer and template; KV pool
    excluded): VmRSS after minus before load."""
    code = ("import gc, re, pathlib; rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', pathlib.Path("
            "'/proc/self/status').read_text()).group(1)); "
            "from backends.model.loader import load_model; from backends.numpy_backend.native.weights import "
            f"STORED_TYPES; before = rss(); m = load_model({model!r}, "
            f"stored={'STORED_TYPES' if weights == 'gguf' else '()'}); gc.collect(); print((rss() - before) / 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


Tables = dict[str, dict[int, StepTiming]]  # per mode, per batch size


@dataclass(frozen=True)
class Turn:
    warm_s: float  # untimed steps after the first, for at least this long
    steps: int  # then timed


def take_turn(backend: NumpyBackend, batch: int, timer: AttentionTimer, turn: Turn) -> list[StepTiming]:
    """The turn's first step, then its steady ones."""
    first, start = decode_step(backend, batch, timer), time.perf_counter()
    while time.perf_counter() - start < turn.warm_s:
        decode_step(backend, batch, timer)
    return [first, *(decode_step(backend, batch, timer) for _ in range(turn.steps))]


def decode_tables(modes: list[Mode], repeats: int, turn: Turn, timer: AttentionTimer) -> tuple[Tables, Tables]:
    """Medians per mode and batch size, of the steady steps and of the turns' first steps; modes and batch sizes
    take turns, round after round."""
    steady: dict[tuple[str, int], list[StepTiming]] = {(m.name, b): [] for m in modes for b in BATCHES}
    first: dict[tuple[str, int], list[StepTiming]] = {(m.name, b): [] for m in modes for b in BATCHES}
    for _ in range(repeats):
        for mode in modes:
            for batch in BATCHES:
                steps = take_turn(mode.backend, batch, timer, turn)
                first[(mode.name, batch)].append(steps[0])
                steady[(mode.name, batch)].extend(steps[1:])
    return ({m.name: {b: _median(steady[(m.name, b)]) for b in BATCHES} for m in modes},
            {m.name: {b: _median(first[(m.name, b)]) for b in BATCHES} for m in modes})


def _median(timings: list[StepTiming]) -> StepTiming:
    return StepTiming(statistics.median(t.seconds for t in timings),
                      {part: statistics.median(t.parts.get(part, 0.0) for t in timings) for part in timings[0].parts},
                      timings[0].shape)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help="of " + ", ".join(MODES))
    parser.add_argument("--warm-ms", type=float, default=150.0, help="steps run untimed in each turn, in ms")
    parser.add_argument("--steps", type=int, default=3, help="steps timed in each turn after the warm-up")
    parser.add_argument("--cpu-isa", default=AUTO, choices=CHOICES, help="the C kernels' CPU tier")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    args = parser.parse_args(argv)
    reexec_with_defaults("bench.backend_step")
    modes = build_modes(args.modes.split(","), args.cpu_isa, args.model)
    print(cpu_line(modes[0].backend.cpu_tier, args.cpu_isa))
    timer = AttentionTimer()
    model_module.paged_attention = timer
    copy, read = copy_bandwidth(), read_bandwidth()
    env = {name: os.environ.get(name, "(unset)") for name in ("OPENBLAS_CORETYPE", *DEFAULTS)}
    print(f"BLAS: {blas_description()}; " + " ".join(f"{k}={v}" for k, v in env.items()))
    forward = modes[0].backend.forward
    print(f"decode attention: {getattr(forward.decode_attention, '__qualname__', '?')}; projections: "
          f"{getattr(forward.project, '__qualname__', '?')} (C kernel up to {MAX_ROWS} rows, then BLAS); fused C "
          f"step: {', '.join(fused_rows(m) for m in modes)}; fast precision: "
          f"{NativeMatmul(fast=True, tier=modes[0].backend.cpu_tier).fast_paths()}")
    print(f"bandwidth: copy {copy / 1e9:.2f} GB/s, read {read / 1e9:.2f} GB/s")
    rss = {w: weights_rss_mib(w, args.model) for w in {MODES[m.name][0] for m in modes}}
    prefill = {}
    for mode in modes:
        prefill[mode.name] = prefill_rate(mode.backend)
        print(f"{mode.name:>14}: streamed per decode step {mode.streamed / 1e6:.0f} MB -> floor "
              f"{mode.streamed / read * 1e3:.1f} ms at the read bandwidth; weights resident "
              f"{rss[MODES[mode.name][0]]:.0f} MiB; prefill at {PREFILL} tokens "
              f"{prefill_note(mode.backend, prefill[mode.name])}")
    tables, first = decode_tables(modes, args.repeats, Turn(args.warm_ms / 1e3, max(1, args.steps)), timer)
    print_tables(modes, tables, first, read)
    print_cost_fits(modes, tables, prefill)


def print_cost_fits(modes: list[Mode], tables: Tables, prefill: dict[str, float]) -> None:
    """The scheduler's step-cost model fitted on each mode's measured steps (the decode steps above and the
    prefill), from the backend's guess: what an ITL target plans with on this machine."""
    pairs = PREFILL * (PREFILL + 1) // 2
    for mode in modes:
        steps = [(t.shape, t.seconds) for t in tables[mode.name].values()]
        steps.append((StepShape(PREFILL, 1, PREFILL, pairs), PREFILL / prefill[mode.name]))
        prior = mode.backend.cost_prior()
        x = np.array([shape.features(prior.large_above) for shape, _ in steps])
        fitted = fit(x, np.array([s for _, s in steps]), prior, 2.0, 64.0)
        per = ", ".join(f"{name} {value * 1e3:.4g}" for name, value in zip(FEATURES, fitted.values(), strict=True))
        print(f"{mode.name:>14} step-cost fit, ms per {per}")


def print_tables(modes: list[Mode], tables: Tables, first: Tables, read: float) -> None:
    base = modes[0].name
    print(f"{'mode':>14} {'batch':>5} {'step ms':>9} {'tokens/s':>9} {'x ' + base:>12} {'attn %':>7} "
          f"{'step/floor':>10} {'first ms':>9}   fused step, ms: projections attention other")
    for mode in modes:
        for batch, timing in tables[mode.name].items():
            rate, ratio = batch / timing.seconds, tables[base][batch].seconds / timing.seconds
            parts = " ".join(f"{timing.parts[p] * 1e3:>6.1f}" for p in STAGES) if len(timing.parts) > 1 else "-"
            print(f"{mode.name:>14} {batch:>5} {timing.seconds * 1e3:>9.1f} {rate:>9.1f} {ratio:>12.2f} "
                  f"{timing.attention_share * 100:>7.1f} {timing.seconds / (mode.streamed / read):>10.2f} "
                  f"{first[mode.name][batch].seconds * 1e3:>9.1f}   {parts}")


if __name__ == "__main__":
    main()
