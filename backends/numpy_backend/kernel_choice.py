"""Which kernels the NumPy backend runs: the C kernels (decode attention, decode-step projections), or the
NumPy references."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from backends.base import BackendError
from backends.numpy_backend.attention import DecodeAttention, decode_attention
from backends.numpy_backend.native.build import KernelBuildError
from backends.numpy_backend.native.kernels import NativeAttention
from backends.numpy_backend.native.matmul import NativeMatmul, Projection, numpy_project

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuKernels:
    decode_attention: DecodeAttention
    project: Projection  # x @ w.T


def choose_kernels(mode: str, heads: int, kv_heads: int, head_dim: int) -> CpuKernels:
    """mode "numpy": the references; "native": the C kernels or an error; "auto": the C kernels when they
    build, and the attention kernel when it supports the model's head shape."""
    if mode == "numpy":
        return CpuKernels(decode_attention, numpy_project)
    try:
        return CpuKernels(_native_attention(mode, heads, kv_heads, head_dim), NativeMatmul().project)
    except KernelBuildError as exc:
        if mode == "native":
            raise BackendError(f"the C kernels did not build: {exc}") from exc
        log.warning("C kernels unavailable, using the slower NumPy ones: %s", exc)
        return CpuKernels(decode_attention, numpy_project)


def _native_attention(mode: str, heads: int, kv_heads: int, head_dim: int) -> DecodeAttention:
    if NativeAttention.supports(heads, kv_heads, head_dim):
        return NativeAttention().decode
    if mode == "native":
        raise BackendError(f"the C attention kernel does not support {heads}/{kv_heads} heads of {head_dim}")
    return decode_attention
