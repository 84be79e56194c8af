"""Which decode attention the NumPy backend runs: the C kernel, or the NumPy reference."""

from __future__ import annotations

import logging
import os

from backends.base import BackendError
from backends.numpy_backend.attention import DecodeAttention, decode_attention
from backends.numpy_backend.native.build import KernelBuildError
from backends.numpy_backend.native.kernels import NativeAttention

log = logging.getLogger(__name__)


def choose_decode_attention(mode: str, heads: int, kv_heads: int, head_dim: int) -> DecodeAttention:
    """mode "numpy": the reference; "native": the C kernel or an error; "auto": the C kernel when it builds
    and supports the model's head shape."""
    if mode == "numpy":
        return decode_attention
    if not NativeAttention.supports(heads, kv_heads, head_dim):
        if mode == "native":
            raise BackendError(f"the C attention kernel does not support {heads}/{kv_heads} heads of {head_dim}")
        return decode_attention
    try:
        return NativeAttention(num_threads=len(os.sched_getaffinity(0))).decode
    except KernelBuildError as exc:
        if mode == "native":
            raise BackendError(f"the C attention kernel did not build: {exc}") from exc
        log.warning("C attention kernel unavailable, using the slower NumPy decode attention: %s", exc)
        return decode_attention
