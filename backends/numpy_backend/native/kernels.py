"""ctypes bindings of the compiled C kernels, with the shape checks the C side relies on."""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from backends.numpy_backend.native.build import SOURCE_DIR, build_library

_F32P = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_I32P = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
_I64 = ctypes.c_int64
LANES = 8  # head_dim must be a multiple of this (paged_attention.c's LANES)
MAX_GROUP = 16  # query heads per kv head (MAX_GROUP there)


class NativeAttention:
    """Decode attention read straight from the paged cache (paged_attention.c).

    A batch is split into `num_threads` runs of sequences with about equal context, each computed by one
    call; ctypes releases the GIL, so the calls run in parallel on a small pool of sleeping (not spinning)
    threads."""

    def __init__(self, num_threads: int = 1, cache_dir: Path | None = None) -> None:
        self.library_path = build_library(SOURCE_DIR / "paged_attention.c", cache_dir)
        self._fn = ctypes.CDLL(str(self.library_path)).decode_attention_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_F32P, _F32P, _F32P, _I32P, _I32P, _F32P, *[_I64] * 5, ctypes.c_float, _I64, _I64]
        self.num_threads = max(1, num_threads)
        self._pool = ThreadPoolExecutor(self.num_threads - 1, "decode-attn") if self.num_threads > 1 else None

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        return head_dim % LANES == 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP

    def decode(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
               context_lens: np.ndarray) -> np.ndarray:
        """q (B, heads, d) for one token per sequence -> (B, heads, d); same contract as the NumPy reference."""
        batch, heads, dim = q.shape
        _, block_size, kv_heads, cache_dim = k_cache.shape
        tables = np.ascontiguousarray(block_tables, np.int32)
        lens = np.ascontiguousarray(context_lens, np.int32)
        _check(self.supports(heads, kv_heads, dim), f"unsupported heads {heads}/{kv_heads}, head_dim {dim}")
        _check(cache_dim == dim and v_cache.shape == k_cache.shape, "cache shape mismatch")
        _check(tables.shape[0] == batch == lens.shape[0], "batch mismatch")
        _check(bool(np.all((lens >= 1) & (lens <= tables.shape[1] * block_size))), "context length out of range")
        out = np.empty((batch, heads, dim), np.float32)
        args = (np.ascontiguousarray(q, np.float32), k_cache, v_cache, tables, lens, out, heads, kv_heads, dim,
                block_size, tables.shape[1], dim**-0.5)
        runs = balanced_runs(lens, self.num_threads)
        pending = [self._pool.submit(self._run, args, *run) for run in runs[1:]] if self._pool else []
        self._run(args, *runs[0])
        for future in pending:
            future.result()
        return out

    def _run(self, args: tuple, first: int, last: int) -> None:
        if self._fn(*args, first, last) != 0:
            raise MemoryError("decode attention could not allocate its scratch memory")


def balanced_runs(context_lens: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Split sequences 0..B into at most `parts` contiguous runs of about equal total context."""
    total = np.cumsum(context_lens, dtype=np.int64)
    cuts = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts) + 1  # cut after the one that crosses
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < len(total)}), len(total)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"native decode attention: {message}")
