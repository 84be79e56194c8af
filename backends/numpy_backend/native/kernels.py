"""ctypes bindings of the compiled C kernels, with the checks the C side relies on.

Arrays go to C as raw addresses (c_void_p), after the dtype and layout checks here: ndpointer argument
checking cost about 30 us a call, more than the kernel itself for a batch of one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from backends.numpy_backend.native.arrays import c_array, is_c_array
from backends.numpy_backend.native.build import SOURCE_DIR, build_library
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
LANES = 8  # head_dim must be a multiple of this (paged_attention.c's LANES)
MAX_GROUP = 16  # query heads per kv head (MAX_GROUP there)
# below this many query-key pairs in a call (decode: the batch's context tokens; a chunk: its tokens x its
# context), one thread is quicker than waking a team
PARALLEL_MIN_TOKENS = 2048
_ERRORS = {-1: "could not allocate its scratch memory", -2: "unsupported head shape",
           -3: "context length outside its block table", -5: "block outside the cache"}
_CHUNK_ERRORS = {**_ERRORS, -3: "chunk longer than its context, or context outside its block table"}


class NativeAttention:
    """Decode attention (`decode`) and a prefill chunk's attention (`chunk`), read straight from the paged
    cache (paged_attention.c, chunk_attention.h), over the whole context or a sliding layer's window. A call with
    at least `parallel_min_tokens` query-key pairs is shared out among the kernels' OpenMP threads."""

    def __init__(self, parallel_min_tokens: int = PARALLEL_MIN_TOKENS, cache_dir: Path | None = None,
                 tier: CpuTier | None = None) -> None:
        """tier: the CPU tier to build for (cpu_tiers.py); None: the highest this CPU runs."""
        self.tier = tier or host_tier()
        self.library_path = build_library(SOURCE_DIR / "paged_attention.c", self.tier, cache_dir)
        self._fn = ctypes.CDLL(str(self.library_path)).decode_attention_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _P, _P, _P, _P, _P, *[_I64] * 5, ctypes.c_float, _I64, _I64, _I64, _I64, _I64]
        self._chunk_fn = ctypes.CDLL(str(self.library_path)).chunk_attention_f32
        self._chunk_fn.restype = ctypes.c_int
        self._chunk_fn.argtypes = [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, *[_I64] * 4, ctypes.c_float, _I64,
                                   _I64, _I64]
        self.parallel_min_tokens = parallel_min_tokens

    @staticmethod
    def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
        return head_dim % LANES == 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP

    def decode(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
               context_lens: np.ndarray, window: int = 0) -> np.ndarray:
        """q (B, heads, d) for one token per sequence -> (B, heads, d); window > 0: over the last `window`
        positions only. Same contract as the NumPy reference; the blocks read (from the window's first one) must
        lie in the cache, those before may be anything (-1: given back by a window pool)."""
        batch, heads, dim = q.shape
        num_blocks, block_size, kv_heads, cache_dim = k_cache.shape
        _check(np.issubdtype(block_tables.dtype, np.integer) and np.issubdtype(context_lens.dtype, np.integer),
               "block tables and context lengths must be integers")
        q, tables, lens = c_array(q, np.float32), c_array(block_tables, np.int32), c_array(context_lens, np.int32)
        _check(cache_dim == dim and v_cache.shape == k_cache.shape and tables.shape[0] == batch == lens.shape[0],
               "shape mismatch")
        out = np.empty((batch, heads, dim), np.float32)
        status = self._fn(q.ctypes.data, k_cache.ctypes.data, v_cache.ctypes.data, tables.ctypes.data,
                          lens.ctypes.data, out.ctypes.data, heads, kv_heads, dim, block_size, tables.shape[1],
                          dim**-0.5, batch, self.parallel_min_tokens, kv_half(k_cache, v_cache), window, num_blocks)
        _check_status(status, _ERRORS)
        return out

    def chunk(self, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_table: np.ndarray,
              context_len: int, window: int = 0) -> np.ndarray:
        """One sequence's prefill chunk q (n, heads, d), the last n of its context_len positions (their K/V
        already stored) -> (n, heads, d), each token attending up to its own position (chunk_attention.h), and
        with window > 0 to the last `window` positions up to it. Same contract as the NumPy reference."""
        n, heads, dim = q.shape
        num_blocks, block_size, kv_heads, cache_dim = k_cache.shape
        _check(np.issubdtype(block_table.dtype, np.integer) and block_table.ndim == 1, "block table not 1-D ints")
        if n == 0:
            return np.empty((0, heads, dim), np.float32)
        q, table = c_array(q, np.float32), c_array(block_table, np.int32)
        _check(cache_dim == dim and v_cache.shape == k_cache.shape, "shape mismatch")
        out = np.empty((n, heads, dim), np.float32)
        status = self._chunk_fn(q.ctypes.data, k_cache.ctypes.data, v_cache.ctypes.data, table.ctypes.data,
                                table.shape[0], num_blocks, context_len, n, out.ctypes.data, heads, kv_heads, dim,
                                block_size, dim**-0.5, self.parallel_min_tokens, kv_half(k_cache, v_cache), window)
        _check_status(status, _CHUNK_ERRORS)
        return out


def kv_half(*layers: np.ndarray) -> int:
    """1 when the cache layers are C-contiguous float16, 0 when float32 (the kernels' kv_half); else an error."""
    for dtype, flag in ((np.float32, 0), (np.float16, 1)):
        if all(is_c_array(layer, dtype) for layer in layers):
            return flag
    raise ValueError("native attention: cache not C-contiguous float32 or float16")


def _check_status(status: int, messages: dict[int, str]) -> None:
    """A kernel's return code: 0 is success, -1 out of memory, the others the input it refused."""
    if status != 0:
        _check(status != -1, messages[-1], MemoryError)
        _check(False, messages.get(status, f"status {status}"))


def _check(condition: bool, message: str, error: type[Exception] = ValueError) -> None:
    if not condition:
        raise error(f"native attention: {message}")
