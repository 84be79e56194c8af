"""One GPU check for the cupy backend, under 5 minutes, for when a GPU machine is available:

    python bench/gpu_check.py --out gpu_check.json [--budget-s 280] [--skip-tests] [--dtype bfloat16]

Sections, each timed and guarded (a failure is recorded and the next section still runs):
  environment       device, memory, CuPy / CUDA versions, peak memory bandwidth (device attributes, or a table)
  compile           NVRTC build of every kernel (cached by CuPy afterwards), and which bf16 GEMM path works
  gpu_tests         `pytest -m gpu tests/cupy_backend` in a child process
  decode_bandwidth  the paged-attention decode kernel at batch 64 with 4k-token contexts (SmolLM2's attention
                    shape): achieved memory bandwidth against the peak, plain and partitioned
  decode_sweep      both decode kernels over batch (1-256) x context (512-8192) x head shape (SmolLM2's, Llama 3
                    8B's, Gemma 3's head_dim 256) and the faster one at each point: the measurement behind the
                    policy table (`python -m bench.decode_policy gpu_check.json` writes it)
  e2e_decode        end-to-end decode tokens/s at batch 1, 64 and 256 through CupyBackend.execute, on random
                    weights in SmolLM2's shape (step time does not depend on the weight values)
  quant_gemv        the dequantizing GEMV alone on Q4_1 and Q8_0 matrices at 1 and 8 rows: bytes of the stored
                    matrix per second against the peak; and a dense copy of each (what larger batches took
                    before the dequantizing GEMM)
  quant_gemm        the dequantizing GEMM alone at 1 to 256 rows on SmolLM2's Q4_1 MLP matrices and Q8_0 head,
                    against the GEMM on the same matrix held dense in the storage dtype (the target: no slower
                    at 64 and 256 rows) and against a dense copy made for the product (the path it replaced);
                    the GEMV beside it at the rows it takes
  e2e_decode_quant  e2e_decode on the same weights stored as the default model's file stores them (Q4_1
                    matrices, a Q8_0 embedding and head), batch 1, 8 (the GEMV), 64 and 256 (the GEMM)
  cuda_graphs       e2e_decode's step time at batch 1, 8, 64 and 256, eager against the replay of the batch's
                    CUDA graphs (captured during the warm-up steps), and the graphs' capture time and memory
  e2e_serve         `pagedserve serve --backend cupy` on random weights in SmolLM2's shape with its real
                    tokenizer, `pagedserve bench` at 1, 16, 64 and 256 streams (448 tokens in, 128 out): output
                    tokens/s and TTFT / TPOT / ITL percentiles; at 64 streams, the served rate against
                    e2e_decode's engine-alone rate (the target: at least 80 %, with TPOT p50 under 5 ms)
Prints a summary and writes every number to --out as JSON. Exit status 0 only when every section passed (or was
skipped on request).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Peak memory bandwidth (bytes/s) by device-name fragment, first match wins: vendor datasheet figures.
PEAK_TABLE = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
)
ATTR_MEMORY_CLOCK_KHZ, ATTR_BUS_WIDTH_BITS = 36, 37  # cudaDevAttrMemoryClockRate, cudaDevAttrGlobalMemoryBusWidth
BANDWIDTH_TARGET = 0.70  # the target for the decode kernel at batch 64, 4k contexts
MIN_TESTS_S = 90.0  # the gpu tests' timeout however little the later sections' estimates leave them
GRAPH_CALLS = 10  # kernel calls per captured graph, where a section times kernels without Python's launches
SERVED_TARGET = 0.80  # served output tokens/s at 64 streams over the engine-alone rate at batch 64


@dataclass(frozen=True)
class Plan:
    """Sizes of the measurements; tests shrink them to dry-run the logic on the CPU emulation."""

    dtype: str = "bfloat16"
    bandwidth_batch: int = 64
    bandwidth_context: int = 4096
    bandwidth_repeats: int = 20
    decode_batches: tuple[int, ...] = (1, 64, 256)
    decode_context: int = 512
    decode_steps: int = 10
    warmup_steps: int = 3
    num_layers: int = 30
    vocab_size: int = 49152  # SmolLM2's
    block_size: int = 16
    tests_timeout_s: float = 150.0
    quant_batches: tuple[int, ...] = (1, 8, 64, 256)
    gemv_shapes: tuple[tuple[str, int, int], ...] = (("q4_1", 16384, 8192), ("q8_0", 49152, 576))  # type, n, k
    gemv_rows: tuple[int, ...] = (1, 8)
    gemv_repeats: int = 20
    # type, n, k: SmolLM2's gate and up projections as one matrix, its down projection, and its head
    gemm_shapes: tuple[tuple[str, int, int], ...] = (("q4_1", 3072, 576), ("q4_1", 576, 1536), ("q8_0", 49152, 576))
    gemm_rows: tuple[int, ...] = (1, 4, 8, 16, 32, 64, 256)  # from 1: where the GEMM overtakes the GEMV
    graph_batches: tuple[int, ...] = (1, 8, 64, 256)
    # the decode kernels' sweep: (query heads, kv heads, head_dim) of SmolLM2, Llama 3 8B and Gemma 3 270M
    sweep_shapes: tuple[tuple[int, int, int], ...] = ((9, 3, 64), (32, 8, 128), (4, 1, 256))
    sweep_batches: tuple[int, ...] = (1, 16, 64, 256)
    sweep_contexts: tuple[int, ...] = (512, 2048, 8192)
    sweep_repeats: int = 5
    serve_backend: str = "cupy"  # a dry run serves through the numpy backend (no device in a child process)
    serve_streams: tuple[int, ...] = (1, 16, 64, 256)
    serve_input_len: int = 448  # contexts of 448-576 tokens, around e2e_decode's 512
    serve_output_len: int = 128


@dataclass
class Report:
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every section passed or was skipped on request (one cut by the time budget is not ok)."""
        return all(s.get("status") in ("ok", "skipped") for s in self.sections.values())


# ---------------------------------------------------------------------------------------------------------
# Pure helpers (no GPU): peak bandwidth, bytes moved, summary.


def peak_from_attributes(memory_clock_khz: float, bus_width_bits: float) -> float:
    """Double data rate: two transfers per memory clock over the whole bus."""
    return memory_clock_khz * 1e3 * (bus_width_bits / 8) * 2


def peak_from_table(device_name: str) -> float | None:
    for fragment, peak in PEAK_TABLE:
        if fragment.lower() in device_name.lower():
            return peak
    return None


def choose_peak(attribute_peak: float | None, table_peak: float | None) -> tuple[float | None, str]:
    """The device attributes when they give a plausible number (CUDA 13 dropped some fields), else the table."""
    if attribute_peak and attribute_peak > 1e11:
        return attribute_peak, "device attributes"
    if table_peak:
        return table_peak, "datasheet table"
    return None, "unknown"


def decode_bytes(context_lens: Sequence[int], heads: int, kv_heads: int, head_dim: int, itemsize: int,
                 block_size: int) -> int:
    """Bytes the decode kernel must move at least: every K and V row of every context once (a kv head shared
    by a GQA group counts once), the block tables it walks, the query and the output."""
    kv = sum(context_lens) * kv_heads * head_dim * itemsize * 2
    tables = sum(-(-c // block_size) for c in context_lens) * 4 + 4 * len(context_lens)
    q_out = 2 * len(context_lens) * heads * head_dim * itemsize
    return kv + tables + q_out


def summary_lines(report: Report) -> list[str]:
    lines = []
    for name, s in report.sections.items():
        head = f"{name:17s} {s.get('status', '?'):8s} {s.get('seconds', 0.0):6.1f}s"
        detail = s.get("summary") or (s.get("error", "").splitlines() or [""])[-1]
        lines.append(f"{head}  {detail}")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Sections. Each takes the shared context and returns a dict with a one-line "summary".


@dataclass
class Context:
    plan: Plan
    device: Any = None  # backends.cupy_backend.device.Device, made by `compile` (or injected by a test)
    timer: Callable[[Callable[[], None], int], float] | None = None  # seconds per call
    env: dict[str, Any] = field(default_factory=dict)


def environment(ctx: Context) -> dict[str, Any]:
    import cupy  # noqa: PLC0415

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    attribute_peak = _attribute_peak(cupy, dev.id, props)
    peak, source = choose_peak(attribute_peak, peak_from_table(name))
    free, total = cupy.cuda.runtime.memGetInfo()
    info = {
        "device": name,
        "compute_capability": dev.compute_capability,
        "multiprocessors": props.get("multiProcessorCount"),
        "memory_gib": round(total / 2**30, 1),
        "free_gib": round(free / 2**30, 1),
        "cupy": cupy.__version__,
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
        "peak_bandwidth_gbs": None if peak is None else round(peak / 1e9, 1),
        "peak_source": source,
        "attribute_peak_gbs": None if attribute_peak is None else round(attribute_peak / 1e9, 1),
        "copy_bandwidth_gbs": round(_copy_bandwidth(cupy) / 1e9, 1),
    }
    ctx.env.update(info)
    info["summary"] = f"{name}, peak {info['peak_bandwidth_gbs']} GB/s ({source}), copy {info['copy_bandwidth_gbs']}"
    return info


def _attribute_peak(cupy: Any, device_id: int, props: dict[str, Any]) -> float | None:
    try:
        clock = cupy.cuda.runtime.deviceGetAttribute(ATTR_MEMORY_CLOCK_KHZ, device_id)
        width = cupy.cuda.runtime.deviceGetAttribute(ATTR_BUS_WIDTH_BITS, device_id)
    except Exception:  # noqa: BLE001 - fall back to the properties struct
        clock, width = props.get("memoryClockRate"), props.get("memoryBusWidth")
    return peak_from_attributes(clock, width) if clock and width else None


def _copy_bandwidth(cupy: Any, num_bytes: int = 1 << 30) -> float:
    """Device-to-device copy (read + write) of 1 GiB: what a streaming kernel can practically reach."""
    src = cupy.ones(num_bytes // 4, cupy.float32)
    dst = cupy.empty_like(src)
    seconds = _event_timer(cupy)(lambda: cupy.copyto(dst, src), 10)
    return 2 * num_bytes / seconds


def _event_timer(cupy: Any) -> Callable[[Callable[[], None], int], float]:
    def timed(fn: Callable[[], None], repeats: int) -> float:
        fn()  # warm-up (allocations, first launch)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3 / repeats

    return timed


def compile_kernels(ctx: Context) -> dict[str, Any]:
    import cupy  # noqa: PLC0415

    from backends.cupy_backend.device import cupy_device  # noqa: PLC0415
    from backends.cupy_backend.gemm import choose_gemm  # noqa: PLC0415
    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    start = time.perf_counter()
    ctx.device = cupy_device()
    ctx.timer = _event_timer(cupy)
    seconds = time.perf_counter() - start
    gemm = choose_gemm(cupy, storage_for("bfloat16")).name
    info = {"compile_seconds": round(seconds, 1), "bf16_gemm": gemm, **ctx.device.info}
    info["summary"] = f"kernels ready in {seconds:.1f}s (cached afterwards), bf16 GEMM: {gemm}"
    return info


def gpu_tests(ctx: Context) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/cupy_backend", "-q", "-rA", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=ctx.plan.tests_timeout_s,
                              check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        output, code = output + f"\ntimed out after {ctx.plan.tests_timeout_s:.0f}s", None
    last = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    info = {"returncode": code, "summary": last[0], "output_tail": output[-12000:]}
    if code != 0 or " passed" not in last[0]:  # all skipped: CuPy or the device was not usable
        raise SectionFailed(info)
    return info


def decode_bandwidth(ctx: Context) -> dict[str, Any]:
    """The decode kernel alone over a paged cache with shuffled block tables, plain and partitioned."""
    from backends.cupy_backend import launch  # noqa: PLC0415
    from backends.cupy_backend.decode_policy import load_policy  # noqa: PLC0415
    from backends.cupy_backend.ops import Kernels  # noqa: PLC0415
    from backends.cupy_backend.synthetic import SMOLLM2  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    step, qkv, shape, k_cache, v_cache, storage = _decode_problem(device.xp, plan, SMOLLM2)
    moved = decode_bytes([plan.bandwidth_context] * plan.bandwidth_batch, shape.num_heads, shape.num_kv_heads,
                         shape.head_dim, storage.itemsize, plan.block_size)
    peak = ctx.env.get("peak_bandwidth_gbs")
    info: dict[str, Any] = {"batch": plan.bandwidth_batch, "context": plan.bandwidth_context, "dtype": plan.dtype,
                            "bytes": moved, "policy_partitioned": load_policy().partitioned(
                                plan.bandwidth_context, plan.bandwidth_batch, shape.num_heads, shape.head_dim,
                                launch.DEFAULT_PARTITION_SIZE, plan.dtype)}
    for label, split in (("plain", False), ("partitioned", True)):
        kernels = Kernels(device.xp, device.launcher, storage, split_decode=split)

        def attend(k: Kernels = kernels) -> None:
            k.attention(step, qkv, shape, k_cache, v_cache)

        info[label] = _rate(moved, _timer(ctx)(attend, plan.bandwidth_repeats), peak)
    best = max(("plain", "partitioned"), key=lambda k: info[k]["gbs"])
    frac = info[best]["fraction_of_peak"]
    verdict = "" if frac is None else (" (meets" if frac >= BANDWIDTH_TARGET else " (below") + " the 70% target)"
    info["summary"] = (f"{info['plain']['gbs']} GB/s plain, {info['partitioned']['gbs']} GB/s partitioned; "
                       f"best {best} at {frac} of peak{verdict}")
    return info


def _decode_problem(xp: Any, plan: Plan, config: Any) -> tuple[Any, ...]:
    """A decode-only step of `bandwidth_batch` sequences at `bandwidth_context` tokens over random KV."""
    import numpy as np  # noqa: PLC0415

    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    batch, context = plan.bandwidth_batch, plan.bandwidth_context
    storage = storage_for(plan.dtype)
    shape = config  # a ModelConfig: the kernels read its head geometry
    pool_blocks = batch * -(-context // plan.block_size)
    step = _decode_step(xp, plan.block_size, batch, context, pool_blocks)
    rng = np.random.default_rng(1)
    cache_shape = (pool_blocks, plan.block_size, shape.num_kv_heads, shape.head_dim)

    def rand(*dims: int) -> Any:
        return xp.asarray(storage.encode(np, rng.standard_normal(dims, dtype=np.float32)))

    return step, rand(batch, shape.qkv_width), shape, rand(*cache_shape), rand(*cache_shape), storage


def _decode_step(xp: Any, block_size: int, batch: int, context: int, pool_blocks: int) -> Any:
    """The device inputs of a decode step of `batch` sequences at `context` tokens, over blocks drawn shuffled
    from a pool of `pool_blocks`."""
    import numpy as np  # noqa: PLC0415

    from backends.cupy_backend.step_inputs import upload_step  # noqa: PLC0415
    from backends.manual_batch import SeqState, make_batch  # noqa: PLC0415

    per_seq = -(-context // block_size)
    blocks = [int(b) for b in np.random.default_rng(0).permutation(pool_blocks)[: batch * per_seq]]
    seqs = [SeqState(blocks=blocks[i * per_seq : (i + 1) * per_seq], tokens=[7] * (context - 1))
            for i in range(batch)]
    return upload_step(xp, make_batch(seqs, [[7]] * batch, block_size))


def decode_sweep(ctx: Context) -> dict[str, Any]:
    """Both decode kernels over batch x context x head shape, each timed as replays of a CUDA graph of
    GRAPH_CALLS calls (as served decode steps run: no launch cost from Python): microseconds and GB/s of each,
    and the winner at every point, which `python -m bench.decode_policy` turns into the policy table."""
    from backends.cupy_backend.decode_policy import load_policy  # noqa: PLC0415
    from backends.cupy_backend.launch import DEFAULT_PARTITION_SIZE  # noqa: PLC0415
    from backends.cupy_backend.synthetic import SMOLLM2  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    points, policy = [], load_policy()
    for heads, kv_heads, head_dim in plan.sweep_shapes:
        config = replace(SMOLLM2, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
        caches = _zero_caches(ctx, config)  # the largest point's; the kernels' time does not depend on values
        for batch, context in itertools.product(plan.sweep_batches, plan.sweep_contexts):
            point = _sweep_point(ctx, config, caches, batch, context)
            point["policy_partitioned"] = policy.partitioned(context, batch, heads, head_dim,
                                                             DEFAULT_PARTITION_SIZE, plan.dtype)
            points.append(point)
        del caches
    agree = sum(p["policy_partitioned"] == p["partitioned_wins"] for p in points)
    return {"dtype": plan.dtype, "device": device.name, "partition_size": DEFAULT_PARTITION_SIZE,
            "points": points, "policy": policy.describe(),
            "summary": f"{len(points)} points; the policy in use picks the faster kernel at {agree} of them"}


def _zero_caches(ctx: Context, config: Any) -> tuple[Any, Any]:
    """K and V caches for the sweep's largest batch x context, allocated on the device."""
    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    plan, xp = ctx.plan, _need_device(ctx).xp
    blocks = max(plan.sweep_batches) * -(-max(plan.sweep_contexts) // plan.block_size)
    shape = (blocks, plan.block_size, config.num_kv_heads, config.head_dim)
    dtype = storage_for(plan.dtype).dtype
    return xp.zeros(shape, dtype=dtype), xp.zeros(shape, dtype=dtype)


def _sweep_point(ctx: Context, config: Any, caches: tuple[Any, Any], batch: int, context: int) -> dict[str, Any]:
    import numpy as np  # noqa: PLC0415

    from backends.cupy_backend.ops import Kernels  # noqa: PLC0415
    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    plan, device, storage = ctx.plan, _need_device(ctx), storage_for(ctx.plan.dtype)
    step = _decode_step(device.xp, plan.block_size, batch, context, len(caches[0]))
    qkv = device.xp.asarray(storage.encode(np, np.full((batch, config.qkv_width), 0.5, np.float32)))
    moved = decode_bytes([context] * batch, config.num_heads, config.num_kv_heads, config.head_dim,
                         storage.itemsize, plan.block_size)
    out: dict[str, Any] = {"batch": batch, "context": context, "heads": config.num_heads,
                           "kv_heads": config.num_kv_heads, "head_dim": config.head_dim}
    for label, split in (("plain", False), ("partitioned", True)):
        kernels = Kernels(device.xp, device.launcher, storage, split_decode=split)
        attend = partial(kernels.attention, step, qkv, config, *caches)
        out[label] = _rate(moved, _replay_seconds(ctx, attend, plan.sweep_repeats), ctx.env.get("peak_bandwidth_gbs"))
    out["partitioned_wins"] = out["partitioned"]["microseconds"] < out["plain"]["microseconds"]
    return out


def _replay_seconds(ctx: Context, fn: Callable[[], Any], repeats: int) -> float:
    """Seconds per call of `fn`, from replays of a graph of GRAPH_CALLS calls (eager calls where the device
    captures no graphs)."""
    graphs = _need_device(ctx).graphs
    if graphs is None:
        return _timer(ctx)(fn, repeats)
    graph, _ = graphs.capture(lambda: [fn() for _ in range(GRAPH_CALLS)])
    return _timer(ctx)(lambda: graphs.replay(graph), repeats) / GRAPH_CALLS


def e2e_decode(ctx: Context) -> dict[str, Any]:
    """CupyBackend.execute on decode-only batches (upload, forward, device sampling, ids back to the host)."""
    return _e2e(ctx, stored=False, batches=ctx.plan.decode_batches)


def e2e_decode_quant(ctx: Context) -> dict[str, Any]:
    """e2e_decode with the weights stored like the default model's: up to 8 rows go through the dequantizing
    GEMV, larger batches through the dequantizing GEMM."""
    return _e2e(ctx, stored=True, batches=ctx.plan.quant_batches)


def _e2e(ctx: Context, stored: bool, batches: Sequence[int]) -> dict[str, Any]:
    from backends.cupy_backend.backend import CupyBackend  # noqa: PLC0415
    from backends.cupy_backend.synthetic import random_weights, smollm2_shape, stored_like_default  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    config = replace(smollm2_shape(plan.num_layers), vocab_size=plan.vocab_size)
    weights = stored_like_default(random_weights(config)) if stored else random_weights(config)
    per_seq = -(-(plan.decode_context + 1) // plan.block_size)
    backend = CupyBackend(config, weights, device, dtype=plan.dtype)
    backend.init_cache(max(batches) * per_seq, plan.block_size)
    info: dict[str, Any] = {"dtype": plan.dtype, "context": plan.decode_context, "layers": plan.num_layers,
                            "gemm": backend.gemm.name, "weight_bytes": backend.weights.num_bytes, "batches": {}}
    for batch in batches:
        seconds = _decode_step_seconds(backend, batch, per_seq, plan)
        info["batches"][str(batch)] = {"step_ms": round(seconds * 1e3, 3), "tokens_per_s": round(batch / seconds, 2)}
    if not stored:  # the engine-alone rate e2e_serve compares the served one with
        ctx.env["engine_tokens_per_s"] = {b: v["tokens_per_s"] for b, v in info["batches"].items()}
    rates = ", ".join(f"b{b}: {v['tokens_per_s']} tok/s" for b, v in info["batches"].items())
    weights_label = "Q4_1/Q8_0 as stored" if stored else plan.dtype
    info["summary"] = f"{plan.dtype}, weights {weights_label}, context {plan.decode_context}: {rates}"
    return info


def quant_gemv(ctx: Context) -> dict[str, Any]:
    """The dequantizing GEMV alone on random blocks (the time does not depend on their values): stored bytes
    per second against the peak at each row count, and the dense copy (blocks read, storage dtype written)."""
    from backends.cupy_backend.quant_ops import QuantKernels  # noqa: PLC0415
    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    kernels = QuantKernels(device.xp, device.launcher, storage_for(plan.dtype))
    info: dict[str, Any] = {"dtype": plan.dtype, "matrices": {}}
    for qtype, n, k in plan.gemv_shapes:
        w = _random_device_blocks(ctx, qtype, n, k)
        info["matrices"][f"{qtype} {n}x{k}"] = _gemv_rates(ctx, kernels, w)
    info["summary"] = "; ".join(f"{name}: {_gemv_summary(m)}" for name, m in info["matrices"].items())
    return info


def _gemv_rates(ctx: Context, kernels: Any, w: Any) -> dict[str, Any]:
    import numpy as np  # noqa: PLC0415

    plan, peak, xp = ctx.plan, ctx.env.get("peak_bandwidth_gbs"), kernels.xp
    out: dict[str, Any] = {"stored_bytes": w.nbytes}
    for rows in plan.gemv_rows:
        x = xp.asarray(kernels.storage.encode(np, np.ones((rows, w.shape[1]), np.float32)))

        def gemv(x: Any = x) -> None:
            kernels.gemv(x, w)

        out[f"rows_{rows}"] = _rate(w.nbytes, _timer(ctx)(gemv, plan.gemv_repeats), peak)
    seconds = _timer(ctx)(lambda: kernels.dense(w), plan.gemv_repeats)
    out["dense_copy"] = _rate(w.nbytes + w.shape[0] * w.shape[1] * kernels.storage.itemsize, seconds, peak)
    return out


def quant_gemm(ctx: Context) -> dict[str, Any]:
    """The dequantizing GEMM against the GEMM of the same matrix held dense in the storage dtype (dequantized
    once, as a dense upload holds it; cuBLAS on a GPU) and against the dense copy made for each product that
    larger batches took before; and the GEMV at the row counts it takes."""
    from backends.cupy_backend.gemm import choose_gemm  # noqa: PLC0415
    from backends.cupy_backend.quant_ops import QuantKernels  # noqa: PLC0415
    from backends.cupy_backend.storage import storage_for  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    storage = storage_for(plan.dtype)
    kernels, gemm = QuantKernels(device.xp, device.launcher, storage), choose_gemm(device.xp, storage)
    info: dict[str, Any] = {"dtype": plan.dtype, "dense_gemm": gemm.name, "matrices": {},
                            "tensor_cores": device.info.get("tensor_cores")}
    for qtype, n, k in plan.gemm_shapes:
        info["matrices"][f"{qtype} {n}x{k}"] = _gemm_times(ctx, kernels, gemm, _random_device_blocks(ctx, qtype, n, k))
    big = [r for m in info["matrices"].values() for rows, r in m.items() if int(rows) >= 64]
    info["target_met"] = bool(big) and all(r["quant_over_dense"] <= 1.0 for r in big)
    info["summary"] = "; ".join(f"{name}: {_gemm_summary(m)}" for name, m in info["matrices"].items())
    return info


def _random_device_blocks(ctx: Context, qtype: str, n: int, k: int) -> Any:
    import numpy as np  # noqa: PLC0415

    from backends.cupy_backend.quant_weights import DeviceQuant  # noqa: PLC0415
    from backends.cupy_backend.synthetic import random_blocks  # noqa: PLC0415

    host = random_blocks(np.random.default_rng(0), qtype, n, k)
    return DeviceQuant(qtype, _need_device(ctx).xp.asarray(host.data), host.shape)


def _gemm_times(ctx: Context, kernels: Any, gemm: Any, w: Any) -> dict[str, Any]:
    """Microseconds per product at each of plan.gemm_rows: GEMM on the stored blocks, dense GEMM, dense copy
    then GEMM, and the GEMV where it takes the rows."""
    import numpy as np  # noqa: PLC0415

    from backends.cupy_backend import launch  # noqa: PLC0415

    plan, xp, timed = ctx.plan, kernels.xp, _timer(ctx)
    dense, out = kernels.dense(w), {}
    for rows in plan.gemm_rows:
        x = xp.asarray(kernels.storage.encode(np, np.ones((rows, w.shape[1]), np.float32)))
        products: dict[str, Callable[[], Any]] = {
            "quant_us": partial(kernels.gemm, x, w),
            "dense_us": partial(gemm.linear, x, dense),
            "copy_then_gemm_us": partial(_copy_then_gemm, kernels, gemm, x, w),
        }
        if rows <= launch.QUANT_GEMV_MAX_ROWS:
            products["gemv_us"] = partial(kernels.gemv, x, w)
        times = {key: timed(fn, plan.gemv_repeats) for key, fn in products.items()}
        row = {key: round(seconds * 1e6, 1) for key, seconds in times.items()}
        row["quant_over_dense"] = round(times["quant_us"] / times["dense_us"], 3)
        out[str(rows)] = row
    return out


def _copy_then_gemm(kernels: Any, gemm: Any, x: Any, w: Any) -> Any:
    return gemm.linear(x, kernels.dense(w))


def _gemm_summary(times: dict[str, Any]) -> str:
    """'8 rows 12.0 us (0.9x dense), ...'."""
    return ", ".join(f"{rows} rows {r['quant_us']} us ({r['quant_over_dense']}x dense)" for rows, r in times.items())


def _gemv_summary(rates: dict[str, Any]) -> str:
    """'1 row 2400.5 GB/s (0.5 of peak), 8 rows ...'."""
    parts = []
    for key, r in rates.items():
        if key.startswith("rows_"):
            rows = int(key.removeprefix("rows_"))
            parts.append(f"{rows} row{'s' if rows > 1 else ''} {r['gbs']} GB/s ({r['fraction_of_peak']} of peak)")
    return ", ".join(parts)


def _rate(num_bytes: int, seconds: float, peak: float | None) -> dict[str, Any]:
    gbs = num_bytes / seconds / 1e9
    return {"microseconds": round(seconds * 1e6, 1), "gbs": round(gbs, 1),
            "fraction_of_peak": None if not peak else round(gbs / peak, 3)}


def cuda_graphs(ctx: Context) -> dict[str, Any]:
    """CupyBackend.execute on decode-only batches with CUDA graphs off, then replayed (captured lazily, in the
    warm-up steps), on e2e_decode's random weights."""
    from backends.cupy_backend.synthetic import random_weights, smollm2_shape  # noqa: PLC0415

    plan = ctx.plan
    config = replace(smollm2_shape(plan.num_layers), vocab_size=plan.vocab_size)
    weights = random_weights(config)
    eager, _ = _graph_steps(ctx, config, weights, "off")
    replayed, captured = _graph_steps(ctx, config, weights, "lazy")
    info: dict[str, Any] = {"dtype": plan.dtype, "context": plan.decode_context, "layers": plan.num_layers,
                            "batches": {}, **captured}
    for batch in plan.graph_batches:
        off, on = eager[batch], replayed[batch]
        info["batches"][str(batch)] = {"eager_ms": round(off * 1e3, 3), "replay_ms": round(on * 1e3, 3),
                                       "speedup": round(off / on, 2)}
    steps = ", ".join(f"b{b}: {v['eager_ms']} -> {v['replay_ms']} ms" for b, v in info["batches"].items())
    info["summary"] = f"{plan.dtype} decode step eager -> graph replay: {steps}"
    return info


def _graph_steps(ctx: Context, config: Any, weights: Any, mode: str) -> tuple[dict[int, float], dict[str, Any]]:
    """Median step seconds per batch of plan.graph_batches with graphs `mode`, and what the graphs hold."""
    from backends.cupy_backend.backend import CupyBackend  # noqa: PLC0415
    from backends.cupy_backend.graphs import GraphSettings  # noqa: PLC0415

    plan, device = ctx.plan, _need_device(ctx)
    per_seq = -(-(plan.decode_context + 1) // plan.block_size)
    graphs = GraphSettings(mode, max(plan.graph_batches))
    backend = CupyBackend(config, weights, device, dtype=plan.dtype, graphs=graphs)
    backend.init_cache(max(plan.graph_batches) * per_seq, plan.block_size)
    start = time.perf_counter()
    seconds = {batch: _decode_step_seconds(backend, batch, per_seq, plan) for batch in plan.graph_batches}
    if backend.graphs is None:
        return seconds, {}
    buckets = sorted(backend.graphs.graphs)
    if mode != "off" and len(buckets) != len(set(plan.graph_batches)):  # every batch here is a bucket
        raise RuntimeError(f"graphs captured for buckets {buckets}, not for {plan.graph_batches}")
    return seconds, {"buckets": buckets, "graph_mib": round(backend.graphs.memory_bytes() / 2**20, 1),
                     "warmup_and_steps_s": round(time.perf_counter() - start, 1)}


def _decode_step_seconds(backend: Any, batch: int, per_seq: int, plan: Plan) -> float:
    """Median wall time of one decode step for `batch` sequences at decode_context tokens. The same batch
    runs repeatedly (it rewrites the same slots): identical work each time, no scheduler in the loop."""
    from backends.manual_batch import SeqState, make_batch  # noqa: PLC0415

    seqs = [SeqState(blocks=list(range(i * per_seq, (i + 1) * per_seq)), tokens=[7] * (plan.decode_context - 1))
            for i in range(batch)]
    step = make_batch(seqs, [[11]] * batch, plan.block_size)
    for _ in range(plan.warmup_steps):
        backend.execute(step)
    times = []
    for _ in range(plan.decode_steps):
        start = time.perf_counter()
        backend.execute(step)  # ends with the sampled ids on the host: the GPU work is finished
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def e2e_serve(ctx: Context) -> dict[str, Any]:
    """`pagedserve serve` on random weights in SmolLM2's shape with its real tokenizer, `pagedserve bench` at each
    stream count; at 64 streams, the served tokens/s against e2e_decode's engine-alone rate at batch 64."""
    from bench.gpu_serve import ServePlan, serve_and_bench  # noqa: PLC0415

    plan = ctx.plan
    info = serve_and_bench(ServePlan(plan.serve_backend, plan.dtype, plan.num_layers, plan.serve_streams,
                                     plan.serve_input_len, plan.serve_output_len))
    engine = ctx.env.get("engine_tokens_per_s", {})
    at64, alone = info["streams"].get("64"), engine.get("64")
    info["served_over_engine_at_64"] = round(at64["output_tokens_per_s"] / alone, 3) if at64 and alone else None
    if info["served_over_engine_at_64"] is None:  # said, not left out: e2e_decode did not run, or not at 64
        info["target_met"] = None
    else:
        info["target_met"] = info["served_over_engine_at_64"] >= SERVED_TARGET and at64["tpot_p50_ms"] < 5.0
    rates = ", ".join(f"{n}: {r['output_tokens_per_s']} tok/s, TPOT p50 {r['tpot_p50_ms']} ms"
                      for n, r in info["streams"].items())
    info["summary"] = f"{plan.serve_backend} {plan.dtype} over HTTP, streams {rates}"
    return info


def _need_device(ctx: Context) -> Any:
    if ctx.device is None:
        raise RuntimeError("no device: the compile section did not succeed")
    return ctx.device


def _timer(ctx: Context) -> Callable[[Callable[[], None], int], float]:
    if ctx.timer is not None:
        return ctx.timer

    def wall(fn: Callable[[], None], repeats: int) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        ctx.device.synchronize()
        return (time.perf_counter() - start) / repeats

    return wall


# ---------------------------------------------------------------------------------------------------------
# Running the sections under one time budget.


class SectionFailed(Exception):
    """A section that produced results but failed (e.g. red tests): its results are kept."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(info.get("summary", "failed"))
        self.info = info


Section = Callable[[Context], dict[str, Any]]
SECTIONS: tuple[tuple[str, Section, float], ...] = (  # name, function, seconds it needs at most (roughly)
    ("environment", environment, 10.0),
    ("compile", compile_kernels, 90.0),
    ("gpu_tests", gpu_tests, 60.0),
    ("decode_bandwidth", decode_bandwidth, 15.0),
    ("decode_sweep", decode_sweep, 30.0),
    ("e2e_decode", e2e_decode, 30.0),
    ("quant_gemv", quant_gemv, 15.0),
    ("quant_gemm", quant_gemm, 20.0),
    ("e2e_decode_quant", e2e_decode_quant, 30.0),
    ("cuda_graphs", cuda_graphs, 40.0),
    ("e2e_serve", e2e_serve, 45.0),
)


def run_section(name: str, fn: Section, ctx: Context) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        info, status = fn(ctx), "ok"
    except SectionFailed as exc:
        info, status = exc.info, "failed"
    except Exception as exc:  # noqa: BLE001 - record it and go on: GPU time is scarce
        info, status = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}"}, "error"
    return {"status": status, "seconds": round(time.perf_counter() - start, 1), **info}


def run(ctx: Context, sections: Sequence[tuple[str, Section, float]], budget_s: float,
        skip: Sequence[str] = ()) -> Report:
    report, deadline = Report(), time.monotonic() + budget_s
    for name, fn, needs in sections:
        left = deadline - time.monotonic()
        if name in skip:
            report.sections[name] = {"status": "skipped", "seconds": 0.0, "summary": "skipped by option"}
        elif left < needs:
            report.sections[name] = {"status": "no-time", "seconds": 0.0,
                                     "summary": f"not run: {left:.0f}s of the budget left, needs ~{needs:.0f}s"}
        else:
            if name == "gpu_tests":  # never let the tests eat the benchmarks' share
                share = max(MIN_TESTS_S, left - _after(sections, name))  # the last H200 run's tests took 50 s
                ctx.plan = _with_timeout(ctx.plan, min(ctx.plan.tests_timeout_s, share))
            report.sections[name] = run_section(name, fn, ctx)
        print(summary_lines(Report({name: report.sections[name]}))[0], flush=True)
    return report


def _after(sections: Sequence[tuple[str, Section, float]], name: str) -> float:
    names = [s[0] for s in sections]
    return sum(s[2] for s in sections[names.index(name) + 1 :])


def _with_timeout(plan: Plan, seconds: float) -> Plan:
    return Plan(**{**asdict(plan), "tests_timeout_s": max(30.0, seconds)})


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    parser.add_argument("--budget-s", type=float, default=280.0, help="total time budget (default 280)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"),
                        help="dtype of the bandwidth and decode measurements (default bfloat16)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the gpu-marked tests")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if str(REPO) not in sys.path:  # run as `python bench/gpu_check.py` from anywhere
        sys.path.insert(0, str(REPO))
    start = time.perf_counter()
    ctx = Context(plan=Plan(dtype=args.dtype))
    report = run(ctx, SECTIONS, args.budget_s, skip=("gpu_tests",) if args.skip_tests else ())
    result = {"ok": report.ok, "seconds": round(time.perf_counter() - start, 1), "plan": asdict(ctx.plan),
              "sections": report.sections}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print("\n".join(["", "summary:", *summary_lines(report), f"total {result['seconds']}s -> {args.out}"]))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
