"""Which kernels the NumPy backend runs: the C kernels (decode attention, decode-step projections), or the
NumPy references. Each is chosen on its own, so one that cannot be built or loaded costs only itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from backends.base import BackendError
from backends.numpy_backend.attention import DecodeAttention, decode_attention
from backends.numpy_backend.native.build import KernelBuildError
from backends.numpy_backend.native.kernels import NativeAttention
from backends.numpy_backend.native.matmul import NativeMatmul, Projection, numpy_project

log = logging.getLogger(__name__)
K = TypeVar("K")


@dataclass(frozen=True)
class CpuKernels:
    decode_attention: DecodeAttention
    project: Projection  # x @ w.T


def choose_kernels(mode: str, heads: int, kv_heads: int, head_dim: int) -> CpuKernels:
    """mode "numpy": the references; "native": the C kernels or an error; "auto": each C kernel when it
    builds and loads, and the attention kernel when it supports the model's head shape."""
    if mode == "numpy":
        return CpuKernels(decode_attention, numpy_project)
    if NativeAttention.supports(heads, kv_heads, head_dim):
        attention = _native(mode, "attention", lambda: NativeAttention().decode, decode_attention)
    elif mode == "native":
        raise BackendError(f"the C attention kernel does not support {heads}/{kv_heads} heads of {head_dim}")
    else:
        attention = decode_attention
    return CpuKernels(attention, _native(mode, "projection", lambda: NativeMatmul().project, numpy_project))


def _native(mode: str, what: str, load: Callable[[], K], reference: K) -> K:
    try:
        return load()
    except (KernelBuildError, OSError) as exc:  # OSError: the library would not load (a noexec cache, say)
        if mode == "native":
            raise BackendError(f"the C {what} kernel did not build or load: {exc}") from exc
        log.warning("C %s kernel unavailable, using the slower NumPy one: %s", what, exc)
        return reference
