"""Grammar masks inside the batch's sampling: a constrained row samples only allowed tokens, however it samples;
the other rows are exactly what they are without masks."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from backends.manual_batch import greedy
from backends.sampling import allowed_matrix, sample

VOCAB = 100


@dataclass(frozen=True)
class Masks:
    positions: npt.NDArray[np.int32]
    allowed_ids: list[list[int]]
    width: int = (VOCAB + 31) // 32

    def bits(self) -> npt.NDArray[np.int32]:
        out = np.zeros((len(self.allowed_ids), self.width), np.uint32)
        for row, ids in enumerate(self.allowed_ids):
            for t in ids:
                out[row, t // 32] |= np.uint32(1) << np.uint32(t % 32)
        return out.view(np.int32)


def test_bits_unpack_to_the_allowed_tokens() -> None:
    masks = Masks(np.array([0], np.int32), [[0, 31, 32, 63, 99]])
    ok = allowed_matrix(np, masks.bits(), VOCAB)
    assert np.flatnonzero(ok[0]).tolist() == [0, 31, 32, 63, 99]
    wider = allowed_matrix(np, masks.bits(), 200)  # logits wider than the mask: the rest is not allowed
    assert wider.shape == (1, 200) and np.flatnonzero(wider[0]).tolist() == [0, 31, 32, 63, 99]


def test_constrained_rows_sample_only_allowed_tokens() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, VOCAB)).astype(np.float32)
    masks = Masks(np.array([1, 3], np.int32), [[5, 50], [7]])
    base = replace(greedy(4), temperature=np.array([0, 1.0, 1.0, 0], np.float32))
    for u in np.linspace(0, 0.999, 25):
        uniforms = np.full(4, u, np.float32)
        plain = sample(np, logits, replace(base, uniforms=uniforms))
        out = sample(np, logits, replace(base, uniforms=uniforms, allowed=masks))
        assert out.token_ids[1] in (5, 50) and out.token_ids[3] == 7
        assert out.token_ids[[0, 2]].tolist() == plain.token_ids[[0, 2]].tolist()  # unconstrained: unchanged


def test_masked_logprobs_are_a_distribution_over_allowed_tokens() -> None:
    logits = np.zeros((1, VOCAB), np.float32)
    params = replace(greedy(1), want_logprobs=True, num_top_logprobs=3,
                     allowed=Masks(np.array([0], np.int32), [[3, 4]]))
    out = sample(np, logits, params)
    assert out.logprobs is not None and np.isclose(out.logprobs[0], np.log(0.5))
    assert out.top_token_ids is not None and set(out.top_token_ids[0][:2].tolist()) == {3, 4}


def test_the_callers_logits_are_not_written() -> None:
    logits = np.ones((1, VOCAB), np.float32)
    sample(np, logits, replace(greedy(1), allowed=Masks(np.array([0], np.int32), [[1]])))
    assert (logits == 1).all()
