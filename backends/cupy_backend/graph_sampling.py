"""Sampling inside a captured decode graph. A graph replays the launches of its capture, so nothing here may
decide on the host from device values (no `if` on them, no flatnonzero, no sizes that depend on them): greedy and
random rows are both computed for every row and one is selected per row.

That covers the options whose eager path (backends/sampling.py) needs no such decision: temperature (0: greedy)
and min_p, with the sampled token's logprob. Top-k / top-p (a sort of candidates with a rare fallback),
penalties, grammar masks and top-n logprobs keep the eager sampler, after the graph's forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.base import SamplingInputs
from backends.sampling import GREEDY_BELOW, cdf_targets, log_softmax

EAGER_ONLY = ("presence_penalty", "frequency_penalty", "repetition_penalty", "suppressed_token_ids", "allowed")


def graphable_sampling(p: SamplingInputs) -> bool:
    """Whether sample_in_graph gives what sampling.sample gives for these inputs."""
    if p.num_top_logprobs or any(getattr(p, name) is not None for name in EAGER_ONLY):
        return False
    return bool((np.asarray(p.top_k) <= 0).all() and (np.asarray(p.top_p) >= 1.0).all())


def sample_in_graph(xp: Any, logits: Any, temperature: Any, min_p: Any, uniforms: Any) -> tuple[Any, Any]:
    """(S,) int64 token ids and (S,) float32 logprobs of them, from (S, vocab) float32 logits and (S,) float32
    options: sampling.sample's tokens for rows without top-k / top-p, penalties or grammar."""
    logprobs = log_softmax(xp, logits)
    greedy = xp.argmax(logits, axis=-1).astype(xp.int64)
    random = temperature >= GREEDY_BELOW
    scaled = logits / xp.where(random, temperature, xp.float32(1.0))[:, None]  # greedy rows: any finite scale
    probs = xp.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)
    probs = xp.where(probs >= (min_p * probs.max(axis=-1))[:, None], probs, 0.0)  # min_p 0 keeps every token
    ids = xp.where(random, inverse_cdf(xp, probs, uniforms.astype(xp.float64)), greedy)
    return ids, xp.take_along_axis(logprobs, ids[:, None], axis=-1)[:, 0]


def inverse_cdf(xp: Any, weights: Any, uniforms: Any) -> Any:
    """Per row, the first index whose cumulative weight exceeds uniform * total, counted (how many cumulative
    weights are at most the target): the eager sampler's binary search, without a host loop over rows."""
    cdf = xp.cumsum(weights.astype(xp.float64), axis=-1)
    index = (cdf <= cdf_targets(xp, cdf, uniforms)[:, None]).sum(axis=-1)
    return xp.minimum(index, weights.shape[-1] - 1).astype(xp.int64)
