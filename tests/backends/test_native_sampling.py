"""The C sampler (sampling.c) on every CPU tier this host runs: its draws against an exact float64 inverse CDF
written here, its frequencies against the probabilities, forbidden and filtered tokens never drawn, a row's token
independent of its batch; and backends/sampling.sample handing it only the rows it serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.base import SamplingInputs
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.sampler import NativeSampler
from backends.sampling import sample
from tests.backends.tiers import RUNNABLE, tier_id

MARGIN = 1e-5  # of a row's total weight: targets this close to a token's boundary are left out of the comparison


@pytest.fixture(scope="module", params=RUNNABLE, ids=tier_id)
def sampler(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NativeSampler:
    tier: CpuTier = request.param
    return NativeSampler(tier=tier, cache_dir=tmp_path_factory.mktemp(f"kernels-{tier.name}"))


def reference(logits: np.ndarray, temperature: float, min_p: float, u: float) -> tuple[int, float]:
    """The exact draw in float64, and how far its target lies from the nearest boundary (share of the total)."""
    x = logits.astype(np.float64)
    w = np.exp((x - x.max()) / temperature)
    w = np.where(w >= min_p, w, 0.0)
    cdf = np.cumsum(w)
    target = u * cdf[-1]
    token = int(np.searchsorted(cdf, target, side="right"))
    return token, float(np.abs(cdf - target).min() / cdf[-1])


def random_rows(rng: np.random.Generator, rows: int, vocab: int, scale: float = 3.0) -> np.ndarray:
    return (scale * rng.standard_normal((rows, vocab))).astype(np.float32)


@pytest.mark.parametrize("vocab", [1, 7, 512, 1003, 4099, 262_144])
def test_draws_are_the_exact_inverse_cdf(sampler: NativeSampler, vocab: int) -> None:
    """Vocabularies under one block, one block exactly, and over several blocks with a ragged end."""
    rng = np.random.default_rng(vocab)
    rows = 4 if vocab > 100_000 else 64
    logits = random_rows(rng, rows, vocab)
    temperature = rng.uniform(0.3, 1.7, rows).astype(np.float32)
    min_p = np.where(np.arange(rows) % 2 == 0, 0.0, rng.uniform(0.0, 0.2, rows)).astype(np.float32)
    uniforms = rng.random(rows)
    drawn = sampler(logits, temperature, min_p, uniforms)
    checked = 0
    for r in range(rows):
        want, margin = reference(logits[r], float(temperature[r]), float(min_p[r]), float(uniforms[r]))
        if margin > MARGIN:
            assert drawn[r] == want, (r, drawn[r], want)
            checked += 1
    assert checked >= rows - 1


def test_frequencies_follow_the_probabilities(sampler: NativeSampler) -> None:
    """Uniforms evenly spaced over [0, 1): each token is drawn its probability's share of them, to one draw,
    and a token under min_p never."""
    logits = np.log(np.array([0.05, 0.3, 0.002, 0.4, 0.15, 0.098], np.float64)).astype(np.float32)
    draws = 6000
    uniforms = (np.arange(draws) + 0.5) / draws
    rows = np.broadcast_to(logits, (draws, logits.size))
    for min_p in (0.0, 0.01, 0.3):
        counts = np.bincount(sampler(rows, np.ones(draws, np.float32), np.full(draws, min_p, np.float32), uniforms),
                             minlength=logits.size)
        p = np.exp(logits.astype(np.float64))
        p = np.where(p >= min_p * p.max(), p, 0.0)
        assert np.abs(counts - draws * p / p.sum()).max() <= 1.0, (min_p, counts)


def test_forbidden_tokens_are_never_drawn(sampler: NativeSampler) -> None:
    """-inf logits (a grammar's or a suppression's): not at a target of 0, not at the end, not in between."""
    rng = np.random.default_rng(3)
    logits = random_rows(rng, 1, 1003)[0]
    forbidden = np.array([0, 1, 500, 511, 512, 1001, 1002])
    logits[forbidden] = -np.inf
    allowed = np.flatnonzero(np.isfinite(logits))
    uniforms = np.array([0.0, 1e-12, 0.5, 1 - 2.0**-53, *rng.random(60)])
    rows = np.broadcast_to(logits, (uniforms.size, logits.size))
    drawn = sampler(rows, np.full(uniforms.size, 0.9, np.float32), np.zeros(uniforms.size, np.float32), uniforms)
    assert not np.isin(drawn, forbidden).any()
    assert drawn[0] == allowed[0] and drawn[3] == allowed[-1]
    far = np.zeros((1, 40), np.float32)  # exp(-200) is 0 in float32: no weight, as -inf
    far[0, :9] = -200.0
    assert sampler(far, np.ones(1, np.float32), np.zeros(1, np.float32), np.zeros(1))[0] == 9
    only = np.full((1, 9), -np.inf, np.float32)
    only[0, 4] = 0.0
    assert sampler(only, np.ones(1, np.float32), np.zeros(1, np.float32), np.array([0.99]))[0] == 4


def test_a_rows_token_does_not_depend_on_its_batch(sampler: NativeSampler) -> None:
    rng = np.random.default_rng(4)
    logits = random_rows(rng, 17, 5000)
    temperature, min_p, uniforms = np.full(17, 0.8, np.float32), np.full(17, 0.02, np.float32), rng.random(17)
    together = sampler(logits, temperature, min_p, uniforms)
    alone = [sampler(logits[r:r + 1], temperature[r:r + 1], min_p[r:r + 1], uniforms[r:r + 1])[0] for r in range(17)]
    assert together.tolist() == alone


def test_bad_arguments_are_refused(sampler: NativeSampler) -> None:
    logits = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="positive"):
        sampler(logits, np.array([1.0, 0.0], np.float32), np.zeros(2, np.float32), np.zeros(2))
    with pytest.raises(ValueError, match="per row"):
        sampler(logits, np.ones(3, np.float32), np.zeros(2, np.float32), np.zeros(2))


class Recording:
    """A row sampler that records the rows it is handed and draws with the C sampler."""

    def __init__(self, inner: NativeSampler) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, logits: Any, temperature: Any, min_p: Any, uniforms: Any) -> Any:
        self.calls.append((logits, temperature))
        return self.inner(logits, temperature, min_p, uniforms)


def test_sample_hands_the_row_sampler_only_plain_random_rows(tmp_path: Path) -> None:
    """Greedy rows keep the argmax, top-k / top-p rows NumPy's sampler (the same tokens as without a row sampler),
    and the rest go to the row sampler, once, without a copy when every row is such a row."""
    rng = np.random.default_rng(5)
    n, vocab = 8, 3000
    logits = random_rows(rng, n, vocab)
    params = SamplingInputs(temperature=np.array([0, 0.7, 1, 1.2, 0.9, 0, 1.1, 0.8], np.float32),
                            top_k=np.array([0, 0, 40, 0, 0, 0, 0, 0], np.int32),
                            top_p=np.array([1, 1, 1, 0.9, 1, 1, 1, 1], np.float32),
                            min_p=np.array([0, 0.05, 0, 0, 0, 0, 0.1, 0], np.float32),
                            uniforms=rng.random(n).astype(np.float32))
    recording = Recording(NativeSampler(cache_dir=tmp_path))
    with_kernel, without = sample(np, logits, params, recording), sample(np, logits, params)
    assert len(recording.calls) == 1
    handed, temperatures = recording.calls[0]
    assert np.array_equal(handed, logits[[1, 4, 6, 7]])
    assert temperatures.tolist() == pytest.approx([0.7, 0.9, 1.1, 0.8])
    ids, want = with_kernel.token_ids, without.token_ids
    assert ids[[0, 5]].tolist() == logits[[0, 5]].argmax(axis=-1).tolist()
    assert ids[[2, 3]].tolist() == want[[2, 3]].tolist()
    for r in (1, 4, 6, 7):
        token, margin = reference(logits[r], float(params.temperature[r]), float(params.min_p[r]),
                                  float(params.uniforms[r]))
        assert margin <= MARGIN or ids[r] == token
    plain = SamplingInputs(np.ones(n, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32),
                           np.zeros(n, np.float32), rng.random(n).astype(np.float32))
    sample(np, logits, plain, recording)
    assert recording.calls[1][0] is logits  # the whole batch in one call, not a gathered copy of it
