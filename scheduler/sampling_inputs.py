"""Per-row sampling arrays for a step, with each request's own generator drawing its uniform."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from backends.base import SamplingInputs
from scheduler.sequence import Sequence


def build_sampling_inputs(seqs: list[Sequence], eos_ids: Iterable[int] = ()) -> SamplingInputs:
    params = [s.params for s in seqs]
    uses_penalties = any(p.uses_penalties for p in params)
    return SamplingInputs(
        temperature=np.array([p.temperature for p in params], np.float32),
        top_k=np.array([p.top_k for p in params], np.int32),
        top_p=np.array([p.top_p for p in params], np.float32),
        min_p=np.array([p.min_p for p in params], np.float32),
        uniforms=np.array([0.0 if s.params.greedy else s.rng.random() for s in seqs], np.float32),
        presence_penalty=np.array([p.presence_penalty for p in params], np.float32) if uses_penalties else None,
        frequency_penalty=np.array([p.frequency_penalty for p in params], np.float32) if uses_penalties else None,
        repetition_penalty=np.array([p.repetition_penalty for p in params], np.float32) if uses_penalties else None,
        output_token_ids=_padded([s.output_token_ids for s in seqs]) if uses_penalties else None,
        prompt_token_ids=_padded([s.token_ids[: s.prompt_len] for s in seqs]) if uses_penalties else None,
        suppressed_token_ids=_suppressed(seqs, frozenset(eos_ids)),
        num_top_logprobs=max(p.top_logprobs for p in params),
        want_logprobs=any(p.logprobs for p in params),
    )


def _suppressed(seqs: list[Sequence], eos_ids: frozenset[int]) -> np.ndarray | None:
    """Until min_tokens are out, a sequence may not sample EOS or its stop tokens."""
    if not any(s.params.min_tokens for s in seqs):
        return None
    lists = [_banned(s, eos_ids) for s in seqs]
    return _padded(lists) if any(lists) else None


def _banned(seq: Sequence, eos_ids: frozenset[int]) -> list[int]:
    if seq.num_output_tokens >= seq.params.min_tokens:
        return []
    return sorted(set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else eos_ids))


def _padded(lists: list[list[int]]) -> np.ndarray:
    width = max((len(x) for x in lists), default=0) or 1
    out = np.full((len(lists), width), -1, np.int64)
    for i, ids in enumerate(lists):
        out[i, : len(ids)] = ids
    return out
