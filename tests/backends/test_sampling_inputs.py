"""sample() reads the backend's logits without writing to them, and its penalties still apply."""

from __future__ import annotations

import numpy as np

from backends.base import SamplingInputs
from backends.sampling import sample


def params(**penalties: np.ndarray) -> SamplingInputs:
    zeros = np.zeros(2, np.float32)
    return SamplingInputs(temperature=zeros, top_k=np.zeros(2, np.int32), top_p=np.ones(2, np.float32),
                          min_p=zeros, uniforms=zeros, **penalties)


def test_penalties_and_suppression_apply_without_writing_to_the_logits() -> None:
    logits = np.array([[5.0, 4.0, 3.0, 0.0], [1.0, 4.0, 3.9, 0.0]], np.float32)
    before = logits.copy()
    out = sample(np, logits, params(
        suppressed_token_ids=np.array([[0, -1], [-1, -1]]),  # row 0 may not end: its best token is barred
        output_token_ids=np.array([[-1], [1]]), frequency_penalty=np.array([0.0, 0.5], np.float32),
        presence_penalty=np.array([0.0, 0.0], np.float32)))
    assert out.token_ids.tolist() == [1, 2]  # row 1: token 1 penalised to 3.5, under token 2's 3.9
    np.testing.assert_array_equal(logits, before)


def test_without_penalties_the_greedy_token_is_the_argmax() -> None:
    logits = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    assert sample(np, logits, params()).token_ids.tolist() == logits.argmax(axis=1).tolist()


def test_a_uniform_of_one_draws_the_last_token_of_weight() -> None:
    """A request's uniform is kept in float32, where one just under 1 rounds to 1: the draw is then the last
    token of weight, never a suppressed or top-k-filtered one after it."""
    logits = np.array([[0.0, 1.0, 2.0, 0.5], [0.0, 1.0, 2.0, 3.0]], np.float32)
    one = np.ones(2, np.float32)
    for top_k in (0, 2):
        out = sample(np, logits, SamplingInputs(temperature=one, top_k=np.full(2, top_k, np.int32), top_p=one,
                                                min_p=0 * one, uniforms=one,
                                                suppressed_token_ids=np.array([[3], [-1]])))
        assert out.token_ids.tolist() == ([2, 3] if top_k == 0 else [1, 2])
