"""Which kernels the NumPy backend runs: the C kernels (decode attention, decode-step projections, the fused
small step), or the NumPy references. Each is chosen on its own, so one that cannot be built or loaded costs
only itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from backends.base import BackendError
from backends.model.config import ModelConfig
from backends.model.weights import ModelWeights
from backends.numpy_backend.attention import ChunkAttention, DecodeAttention, decode_attention, prefill_attention
from backends.numpy_backend.native.build import KernelBuildError
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier
from backends.numpy_backend.native.fused_step import NativeFusedStep
from backends.numpy_backend.native.grouped_q8 import group_weights
from backends.numpy_backend.native.kernels import NativeAttention
from backends.numpy_backend.native.matmul import NativeMatmul, Projection, numpy_project
from backends.numpy_backend.native.sampler import NativeSampler
from backends.sampling import RowSampler

log = logging.getLogger(__name__)
K = TypeVar("K")


@dataclass(frozen=True)
class CpuKernels:
    decode_attention: DecodeAttention
    project: Projection  # x @ w.T
    fused_step: NativeFusedStep | None = None  # a small step in one call; None: layer by layer
    chunk_attention: ChunkAttention = prefill_attention  # a prefill chunk's, on the per-layer path
    row_sampler: RowSampler | None = None  # the random rows' draws and the logprobs; None: NumPy's sampler
    # the weights as these kernels read them: the model's, or with Q8_0 regrouped for the fast precision's kernel
    weights: ModelWeights | None = field(default=None, compare=False)


def choose_kernels(mode: str, config: ModelConfig, weights: ModelWeights, precision: str = "exact",
                   tier: CpuTier | None = None, group_q8: bool = True) -> CpuKernels:
    """mode "numpy": the references; "native": the C kernels built for `tier` or an error; "auto": each C
    kernel (the sampler too) when it builds and loads, and the attention and fused-step kernels when they
    support the model's shape. precision "fast": the C projections of batches in bfloat16 products on the amx
    tier, of steps of 1-3 rows on Q4 weights in 8-bit integers from the avx2 and neon tiers up (fast_matmul.h),
    and of any rows on Q8_0 matrices regrouped for the AVX-512 VNNI tiers' kernel (grouped_q8.py; the returned
    kernels' `weights`; group_q8 False keeps them stored, for comparisons); the NumPy kernels have no fast
    precision. tier None: the highest this CPU runs."""
    fast, tier = precision == "fast", tier or host_tier()
    if mode == "numpy":
        return CpuKernels(decode_attention, numpy_project, weights=weights)
    decode, chunk = _attention(mode, config, tier)
    matmul = _native(mode, "projection", lambda: NativeMatmul(fast=fast, tier=tier), None)
    if group_q8 and matmul is not None and matmul.groups_q8:  # before the fused step takes their addresses
        weights = group_weights(weights)
    project = matmul.project if matmul is not None else numpy_project
    sampler = _native(mode, "sampler", lambda: NativeSampler(tier=tier), None)
    return CpuKernels(decode, project, _fused_step(mode, config, weights, fast, tier), chunk, sampler, weights)


def _attention(mode: str, config: ModelConfig, tier: CpuTier) -> tuple[DecodeAttention, ChunkAttention]:
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    if not NativeAttention.supports(heads, kv_heads, head_dim):
        if mode == "native":
            raise BackendError(f"the C attention kernel does not support {heads}/{kv_heads} heads of {head_dim}")
        return decode_attention, prefill_attention
    native = _native(mode, "attention", lambda: NativeAttention(tier=tier), None)
    return (native.decode, native.chunk) if native is not None else (decode_attention, prefill_attention)


def _fused_step(mode: str, config: ModelConfig, weights: ModelWeights, fast: bool,
                tier: CpuTier) -> NativeFusedStep | None:
    if NativeFusedStep.supports(config, weights):
        return _native(mode, "fused step", lambda: NativeFusedStep(config, weights, fast=fast, tier=tier), None)
    if mode == "native":
        raise BackendError("the fused C step does not support this model's shape")
    return None


def _native(mode: str, what: str, load: Callable[[], K], reference: K) -> K:
    try:
        return load()
    except (KernelBuildError, OSError) as exc:  # OSError: the library would not load (a noexec cache, say)
        if mode == "native":
            raise BackendError(f"the C {what} kernel did not build or load: {exc}") from exc
        log.warning("C %s kernel unavailable, using the slower NumPy one: %s", what, exc)
        return reference
