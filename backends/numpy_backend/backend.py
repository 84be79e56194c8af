"""The NumPy backend: executes a StepBatch with the float32 Llama forward on the CPU."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter

import numpy as np

from backends.base import BackendError, Clock, KVGeometry, StepBatch, StepOutput
from backends.config import KV_CACHE_DTYPES
from backends.model.loader import LoadedModel
from backends.numpy_backend.kernel_choice import choose_kernels
from backends.numpy_backend.kv_cache import PagedKVCache
from backends.numpy_backend.model import DecoderForward, check_window_inputs
from backends.numpy_backend.native.cpu_tiers import AUTO, CpuInfo, CpuTier, CpuTierError, describe
from backends.sampling import sample
from backends.step_shape import CostCoefficients, ModelShape

log = logging.getLogger(__name__)


class NumpyBackend:
    name = "numpy"
    clock: Clock | None = None  # wall time
    step_is_instant = False  # a step computes for milliseconds: off the event loop

    def __init__(self, model: LoadedModel, cpu_kernels: str = "auto", cpu_precision: str = "exact",
                 kv_cache_dtype: str = "float32", cpu_isa: str = AUTO, group_q8: bool = True) -> None:
        """group_q8 False: Q8_0 matrices stay as stored in the fast precision (kernel_choice; benchmarks compare)."""
        self.model = model
        self.cpu_precision = cpu_precision
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise BackendError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, not {kv_cache_dtype!r}")
        self.kv_dtype = np.dtype(kv_cache_dtype)  # float16: stored rounded, widened exactly as attention reads it
        cfg = model.config
        report_dequantized(model.weights.dequantized)
        tier = chosen_tier(cpu_isa, cpu_kernels)
        self.cpu_tier = tier if cpu_kernels != "numpy" else None  # the C kernels' build; None: NumPy's run
        kernels = choose_kernels(cpu_kernels if tier else "numpy", cfg, model.weights, cpu_precision, tier,
                                 group_q8)
        if kernels.weights is not None and kernels.weights is not model.weights:  # regrouped: the stored go
            self.model = model = dataclasses.replace(model, weights=kernels.weights)
        self.forward = DecoderForward(cfg, model.weights, kernels.decode_attention, kernels.project,
                                    kernels.fused_step, kernels.chunk_attention)
        self.row_sampler = kernels.row_sampler  # None: NumPy draws every row
        self._cache: PagedKVCache | None = None

    def cost_prior(self) -> CostCoefficients:
        """A first guess at step times for a small CPU (20 GB/s, 50 GFLOP/s, 2 ms of Python a step), cautious
        on purpose; the server's warm-up calibration and then every served step correct it. A step of more
        tokens than the fused C step takes runs layer by layer with BLAS, which first writes a float32 copy of
        each matrix it multiplies: a fixed cost of its own."""
        cfg, shape, bandwidth = self.model.config, ModelShape.of(self.model.config), 20e9
        kv_bytes = 2 * cfg.num_layers * cfg.kv_size * self.kv_geometry.dtype_bytes
        fused = self.forward.fused_step
        return CostCoefficients.roofline(shape, self.model.weights.streamed_bytes, kv_bytes, bandwidth, flops=50e9,
                                         overhead_s=2e-3, large_s=4 * shape.streamed_params / bandwidth,
                                         large_above=fused.max_rows if fused is not None else 0)

    @property
    def kv_geometry(self) -> KVGeometry:
        cfg = self.model.config
        return KVGeometry(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype_bytes=self.kv_dtype.itemsize,
                          sliding_window=cfg.sliding_window, window_layers=len(self._sliding_layers()))

    def _sliding_layers(self) -> list[int]:
        cfg = self.model.config
        return [i for i in range(cfg.num_layers) if cfg.layer_window(i) > 0]

    @property
    def cache(self) -> PagedKVCache:
        if self._cache is None:
            raise RuntimeError("init_cache() must be called before the first step")
        return self._cache

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        """window_blocks > 0: the sliding layers' K/V in a pool of that many blocks of their own."""
        geo, sliding = self.kv_geometry, self._sliding_layers()
        if window_blocks > 0 and not sliding:
            raise BackendError(f"a window pool of {window_blocks} blocks for a model without sliding layers")
        self._cache = PagedKVCache.allocate(geo.num_layers, num_blocks, block_size, geo.num_kv_heads, geo.head_dim,
                                            self.kv_dtype, sliding, window_blocks)

    def compute_logits(self, batch: StepBatch) -> np.ndarray:
        """(S, vocab) float32 logits for the sequences in `batch.sample_rows`."""
        check_window_inputs(batch, self.cache)  # before the copies: a refused step changes nothing
        self.cache.copy_blocks(batch.block_copies, batch.window_block_copies)
        hidden = self.forward.hidden_states(batch, self.cache)
        return self.forward.logits(hidden[batch.sample_token_rows()])

    def execute(self, batch: StepBatch) -> StepOutput:
        start = time.perf_counter()
        logits = self.compute_logits(batch)
        forward_done = time.perf_counter()
        if batch.sampling is None:  # nothing to sample (a step of prefill chunks only)
            return StepOutput(np.zeros(0, np.int64), timings={"forward": forward_done - start})
        result = sample(np, logits, batch.sampling, self.row_sampler)
        timings = {"forward": forward_done - start, "sample": time.perf_counter() - forward_done}
        return StepOutput(result.token_ids, result.logprobs, result.top_token_ids, result.top_logprobs, timings)


def chosen_tier(cpu_isa: str, cpu_kernels: str) -> CpuTier | None:
    """The CPU tier the C kernels are built for, said once at start-up; a forced one this CPU cannot run is a
    BackendError naming what it lacks. None: no tier fits this CPU (another architecture), so the NumPy
    kernels run, unless the C ones were asked for."""
    cpu = CpuInfo.of_this_host()
    try:
        tier = cpu.choose(cpu_isa)
    except CpuTierError as exc:
        if cpu_isa != AUTO or cpu_kernels == "native":
            raise BackendError(str(exc)) from exc
        log.warning("%s: the NumPy kernels run", exc)
        return None
    how = "forced by cpu_isa" if cpu_isa != AUTO else "the highest this CPU runs"
    unused = " (unused: the NumPy kernels run)" if cpu_kernels == "numpy" else ""
    log.info("CPU tier %s: %s, %s; this CPU runs %s%s", tier.name, tier.summary, how, describe(cpu.runnable()),
             unused)
    return tier


def report_dequantized(names: tuple[str, ...]) -> None:
    """Says once, at start-up, which matrices are float32 copies because no kernel reads their stored type."""
    if names:
        kinds = Counter(name.rsplit(" (", 1)[-1].rstrip(")") for name in names)
        summary = ", ".join(f"{count} x {kind}" for kind, count in sorted(kinds.items()))
        log.warning("%d weight matrices are float32 copies, no kernel reading their stored type (%s): %s",
                    len(names), summary, ", ".join(names[:6]) + (", ..." if len(names) > 6 else ""))
