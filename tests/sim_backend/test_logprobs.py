from __future__ import annotations

from dataclasses import replace

import numpy as np

from backends.base import StepBatch
from backends.model.loader import ModelFiles
from tests.sim_backend.helpers import backend, decode_batch


def with_logprobs(batch: StepBatch, want: bool, k: int) -> StepBatch:
    assert batch.sampling is not None
    return replace(batch, sampling=replace(batch.sampling, want_logprobs=want, num_top_logprobs=k))


def test_no_logprobs_unless_asked(files: ModelFiles) -> None:
    out = backend(files).execute(decode_batch([5, 6], [3, 4]))
    assert out.logprobs is None and out.top_token_ids is None and out.top_logprobs is None


def test_sampled_logprob_only(files: ModelFiles) -> None:
    out = backend(files).execute(with_logprobs(decode_batch([5, 6, 7], [3, 4, 5]), True, 0))
    assert out.logprobs is not None and out.logprobs.shape == (3,) and out.logprobs.dtype == np.float32
    assert np.all(out.logprobs < 0) and np.all(out.logprobs > np.log(0.39))
    assert out.top_token_ids is None


def test_top_logprobs_are_a_plausible_distribution(files: ModelFiles) -> None:
    n, k = 50, 20
    batch = with_logprobs(decode_batch(list(range(100, 100 + n)), [30] * n), True, k)
    out = backend(files).execute(batch)
    assert out.top_token_ids is not None and out.top_logprobs is not None and out.logprobs is not None
    assert out.top_token_ids.shape == (n, k) and out.top_logprobs.shape == (n, k)
    assert np.array_equal(out.top_token_ids[:, 0], out.token_ids)  # the pick is the top choice
    assert np.array_equal(out.top_logprobs[:, 0], out.logprobs)
    assert np.all(np.diff(out.top_logprobs, axis=1) < 0)
    assert np.all(np.exp(out.top_logprobs.astype(np.float64)).sum(axis=1) < 1)
    assert all(len(set(row)) == k for row in out.top_token_ids.tolist())
    special = set(files.tokenizer.special_ids)
    assert not special & set(out.top_token_ids.ravel().tolist())


def test_logprobs_are_deterministic(files: ModelFiles) -> None:
    batch = with_logprobs(decode_batch([9, 10], [11, 12]), True, 5)
    a, b = backend(files).execute(batch), backend(files).execute(batch)
    assert a.top_token_ids is not None and b.top_token_ids is not None
    assert a.logprobs is not None and b.logprobs is not None
    assert np.array_equal(a.top_token_ids, b.top_token_ids) and np.array_equal(a.logprobs, b.logprobs)
