"""A plausible, deterministic distribution around each sampled token, for requests that ask for logprobs.

The sampled token gets probability p in [0.4, 0.95); the j-th alternative (1-based) gets (1 - p) / 2^j. The
values are therefore sorted, sum to under 1, and the sampled token is the top choice, as it would be for a
greedy row of a real model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import FloatArray, LongArray
from backends.sim_backend.tokens import U64Array, fold

TOP_PROB_LOW, TOP_PROB_SPAN = 0.4, 0.55


@dataclass(frozen=True)
class PseudoLogprobs:
    logprobs: FloatArray  # (S,)
    top_token_ids: LongArray | None  # (S, k)
    top_logprobs: FloatArray | None  # (S, k)


def pseudo_logprobs(hashes: U64Array, index: LongArray, vocab: LongArray, k: int) -> PseudoLogprobs:
    top = TOP_PROB_LOW + TOP_PROB_SPAN * _unit(fold(hashes, 1))
    chosen = np.log(top).astype(np.float32)
    if k <= 0:
        return PseudoLogprobs(chosen, None, None)
    j = np.arange(k, dtype=np.int64)
    # alternatives step through the vocabulary by a per-row stride with (k - 1) * stride < n: all distinct
    max_stride = max((vocab.shape[0] - 1) // max(k - 1, 1), 1)
    stride = 1 + (fold(hashes, 2) % np.uint64(max_stride)).astype(np.int64)
    ids = vocab[(index[:, None] + j[None, :] * stride[:, None]) % vocab.shape[0]]
    values = np.log(1.0 - top)[:, None] - j[None, :] * np.log(2.0)
    values[:, 0] = chosen
    return PseudoLogprobs(chosen, ids, values.astype(np.float32))


def _unit(h: U64Array) -> np.ndarray:
    """Uniform floats in [0, 1) from the top 53 bits of each hash."""
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
