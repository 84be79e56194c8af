"""ctypes binding of sampling.c: temperature, min-p, top-k and top-p draws over whole rows, and the rows'
logprobs, for backends/sampling.py's RowSampler slot."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from backends.numpy_backend.native.arrays import c_array
from backends.numpy_backend.native.build import SOURCE_DIR, build_library
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_ERRORS = {-1: "could not allocate its scratch memory", -2: "empty vocabulary, or top logprobs out of range",
           -3: "a token outside the vocabulary"}
MAX_TOP = 64  # sampling.c's


class NativeSampler:
    """One token per row by inverse CDF over exp((logit - max) / temperature), min-p, top-k and top-p
    filtered, and the rows' logprobs (sampling.c)."""

    def __init__(self, tier: CpuTier | None = None, cache_dir: Path | None = None) -> None:
        self.tier = tier or host_tier()
        self.library_path = build_library(SOURCE_DIR / "sampling.c", self.tier, cache_dir)
        self._fn = ctypes.CDLL(str(self.library_path)).sample_rows_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _I64, _I64, _P, _P, _P, _P, _P, _P]
        self._logprobs_fn = ctypes.CDLL(str(self.library_path)).row_logprobs_f32
        self._logprobs_fn.restype = ctypes.c_int
        self._logprobs_fn.argtypes = [_P, _I64, _I64, _P, _I64, _P, _P, _P]

    def __call__(self, logits: np.ndarray, temperature: np.ndarray, min_p: np.ndarray, uniforms: np.ndarray,
                 top_k: np.ndarray | None = None, top_p: np.ndarray | None = None) -> np.ndarray:
        """logits (rows, vocab); per row a temperature (> 0), a min_p in [0, 1], a uniform in [0, 1), and
        optionally a top_k (0: off) and a top_p in (0, 1] (1: off) -> (rows,) int64 token ids."""
        rows, vocab = logits.shape
        top_k = np.zeros(rows, np.int64) if top_k is None else top_k
        top_p = np.ones(rows, np.float32) if top_p is None else top_p
        logits = c_array(logits, np.float32)
        temperature, min_p, top_p = (c_array(a, np.float32) for a in (temperature, min_p, top_p))
        top_k, uniforms = c_array(top_k, np.int64), c_array(uniforms, np.float64)
        if not all(a.shape == (rows,) for a in (temperature, min_p, uniforms, top_k, top_p)):
            raise ValueError("native sampler: one temperature, min_p, uniform, top_k and top_p per row")
        if (temperature <= 0).any() or (top_p <= 0).any():
            raise ValueError("native sampler: temperatures and top_p must be positive (greedy rows take the argmax)")
        out = np.empty(rows, np.int64)
        status = self._fn(logits.ctypes.data, rows, vocab, temperature.ctypes.data, min_p.ctypes.data,
                          top_k.ctypes.data, top_p.ctypes.data, uniforms.ctypes.data, out.ctypes.data)
        _check_status(status)
        return out

    def logprobs(self, logits: np.ndarray, tokens: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Each row's log-probability of its token (rows,), and with k > 0 its k most likely tokens (rows, k)
        and their log-probabilities, most likely first (ties by index)."""
        rows, vocab = logits.shape
        logits, tokens = c_array(logits, np.float32), c_array(tokens, np.int64)
        if tokens.shape != (rows,) or not 0 <= k <= min(MAX_TOP, vocab):
            raise ValueError(f"native sampler: one token per row, and 0 to {min(MAX_TOP, vocab)} top logprobs")
        chosen = np.empty(rows, np.float32)
        top_ids, top_values = np.empty((rows, k), np.int64), np.empty((rows, k), np.float32)
        _check_status(self._logprobs_fn(logits.ctypes.data, rows, vocab, tokens.ctypes.data, k, chosen.ctypes.data,
                                        top_ids.ctypes.data, top_values.ctypes.data))
        return chosen, top_ids if k else None, top_values if k else None


def _check_status(status: int) -> None:
    if status != 0:
        error = MemoryError if status == -1 else ValueError
        raise error(f"native sampler: {_ERRORS.get(status, f'status {status}')}")
