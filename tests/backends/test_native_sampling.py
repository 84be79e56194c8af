"""The C sampler (sampling.c) on every CPU tier this host runs: its draws against an exact float64 inverse CDF
written here (temperature, min-p, top-k, top-p), its frequencies against the probabilities, forbidden and filtered
tokens never drawn, ties at a top-k cut, a row's token independent of its batch; its logprobs against a float64
log-softmax; and backends/sampling.sample handing it the random rows and the logprobs."""

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


def reference(logits: np.ndarray, temperature: float, min_p: float, u: float, top_k: int = 0,
              top_p: float = 1.0) -> tuple[int, float]:
    """The exact draw in float64, and how far its target lies from the nearest boundary (share of the total).
    Kept: min-p, then the first tokens in order of weight (ties by index) while rank < top_k and the weight ranked
    before is under top_p of the total, the top one always; drawn in vocabulary order."""
    x = logits.astype(np.float64)
    w = np.exp((x - x.max()) / temperature)
    w = np.where(w >= min_p, w, 0.0)
    order = np.lexsort((np.arange(w.size), -w))
    ranked = w[order]
    keep = ((np.cumsum(ranked) - ranked) < top_p * w.sum()) & ((top_k <= 0) | (np.arange(w.size) < top_k))
    keep[0] = True
    w[order[~keep]] = 0.0
    cdf = np.cumsum(w)
    target = u * cdf[-1]
    token = int(np.searchsorted(cdf, target, side="right"))
    return token, float(np.abs(cdf - target).min() / cdf[-1])


def random_rows(rng: np.random.Generator, rows: int, vocab: int, scale: float = 3.0) -> np.ndarray:
    return (scale * rng.standard_normal((rows, vocab))).astype(np.float32)


FILTERS = [(0, 1.0), (1, 1.0), (40, 1.0), (0, 0.9), (0, 0.3), (50, 0.95)]  # (top_k, top_p)


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: f"top_k={f[0]},top_p={f[1]}")
@pytest.mark.parametrize("vocab", [1, 7, 512, 1003, 4099, 262_144])
def test_draws_are_the_exact_inverse_cdf(sampler: NativeSampler, vocab: int, filters: tuple[int, float]) -> None:
    """Vocabularies under one block, one block exactly, and over several blocks with a ragged end."""
    rng = np.random.default_rng(vocab)
    rows = 4 if vocab > 100_000 else 64
    logits = random_rows(rng, rows, vocab)
    temperature = rng.uniform(0.3, 1.7, rows).astype(np.float32)
    min_p = np.where(np.arange(rows) % 2 == 0, 0.0, rng.uniform(0.0, 0.2, rows)).astype(np.float32)
    uniforms = rng.random(rows)
    top_k, top_p = np.full(rows, filters[0], np.int64), np.full(rows, filters[1], np.float32)
    drawn = sampler(logits, temperature, min_p, uniforms, top_k, top_p)
    checked = 0
    for r in range(rows):
        want, margin = reference(logits[r], float(temperature[r]), float(min_p[r]), float(uniforms[r]),
                                 filters[0], float(top_p[r]))
        if margin > MARGIN:
            assert drawn[r] == want, (r, drawn[r], want)
            checked += 1
    assert checked >= rows - 1


@pytest.mark.parametrize(("min_p", "top_k", "top_p"), [(0.0, 0, 1.0), (0.01, 0, 1.0), (0.3, 0, 1.0),
                                                     (0.0, 3, 1.0), (0.0, 0, 0.8), (0.0, 0, 0.35)])
def test_frequencies_follow_the_probabilities(sampler: NativeSampler, min_p: float, top_k: int,
                                              top_p: float) -> None:
    """Uniforms evenly spaced over [0, 1): each token is drawn its share of the kept probability to one draw,
    and a filtered one never (top-k 3 and top-p 0.8 keep 0.4, 0.3, 0.15; top-p 0.35 keeps 0.4 alone)."""
    p = np.array([0.05, 0.3, 0.002, 0.4, 0.15, 0.098], np.float64)
    kept = {(0.0, 0, 1.0): p, (0.01, 0, 1.0): np.where(p >= 0.004, p, 0), (0.3, 0, 1.0): np.where(p >= 0.12, p, 0),
            (0.0, 3, 1.0): np.where(p >= 0.15, p, 0), (0.0, 0, 0.8): np.where(p >= 0.15, p, 0),
            (0.0, 0, 0.35): np.where(p >= 0.4, p, 0)}[(min_p, top_k, top_p)]
    draws = 6000
    uniforms = (np.arange(draws) + 0.5) / draws
    rows = np.broadcast_to(np.log(p).astype(np.float32), (draws, p.size))
    counts = np.bincount(sampler(rows, np.ones(draws, np.float32), np.full(draws, min_p, np.float32), uniforms,
                                 np.full(draws, top_k, np.int64), np.full(draws, top_p, np.float32)),
                         minlength=p.size)
    assert np.abs(counts - draws * kept / kept.sum()).max() <= 1.0, counts


def test_ties_at_the_cut_keep_the_first_indices(sampler: NativeSampler) -> None:
    """Equal logits ranked by index: top-k 3 of ten equal tokens keeps tokens 0-2, a third each; a top-p too
    small for one token keeps the top one."""
    draws = 300
    uniforms = (np.arange(draws) + 0.5) / draws
    ones = np.ones(draws, np.float32)
    equal = np.zeros((draws, 10), np.float32)
    drawn = sampler(equal, ones, 0 * ones, uniforms, np.full(draws, 3, np.int64))
    assert np.bincount(drawn, minlength=10).tolist() == [100, 100, 100, 0, 0, 0, 0, 0, 0, 0]
    peaked = np.tile(np.array([0.0, 2.0, 1.0, 2.0], np.float32), (draws, 1))
    assert set(sampler(peaked, ones, 0 * ones, uniforms, None, np.full(draws, 1e-6, np.float32))) == {1}


@pytest.mark.parametrize(("probabilities", "top_p", "kept"), [([0.5, 0.5], 0.5, [0]),
                                                              ([0.25, 0.25, 0.125, 0.125, 0.125, 0.125], 0.5, [0, 1])])
def test_top_p_stops_where_the_mass_before_reaches_it(sampler: NativeSampler, probabilities: list[float],
                                                      top_p: float, kept: list[int]) -> None:
    """NumPy's rule at its boundary: a token is kept while the mass ranked before it is under top_p."""
    draws = 400
    logits = np.broadcast_to(np.log(np.array(probabilities, np.float32)), (draws, len(probabilities)))
    ones = np.ones(draws, np.float32)
    drawn = sampler(logits, ones, 0 * ones, (np.arange(draws) + 0.5) / draws, None, np.full(draws, top_p, np.float32))
    assert sorted(set(drawn.tolist())) == kept


@pytest.mark.parametrize(("vocab", "top_k"), [(1003, 600), (1003, 1001), (262_144, 3000)])
def test_a_cut_among_equal_logits_keeps_the_first_indices(sampler: NativeSampler, vocab: int, top_k: int) -> None:
    """Past the first block, into the ragged tail, and among more equal weights than a bucket sorts (the select
    then goes down to the weights' last bits): tokens 0 .. top_k - 1, each drawn equally often."""
    draws = 2 * top_k if vocab < 10_000 else 6
    uniforms = (np.arange(draws) + 0.5) / draws
    ones = np.ones(draws, np.float32)
    logits = np.zeros((1, vocab), np.float32)
    drawn = np.concatenate([sampler(logits, ones[:1], 0 * ones[:1], uniforms[i:i + 1], np.full(1, top_k))
                            for i in range(draws)])
    if vocab < 10_000:
        assert np.bincount(drawn, minlength=vocab).tolist() == [2] * top_k + [0] * (vocab - top_k)
    else:
        assert drawn.tolist() == (uniforms * top_k).astype(np.int64).tolist()


def test_flat_rows_are_drawn_as_the_reference(sampler: NativeSampler) -> None:
    """Logits within a few hundredths of each other: most tokens in one bucket of the first digit."""
    rng = np.random.default_rng(8)
    logits = random_rows(rng, 2, 262_144, scale=0.02)
    for top_k, top_p in ((50, 1.0), (0, 0.9)):
        uniforms = rng.random(2)
        drawn = sampler(logits, np.ones(2, np.float32), np.zeros(2, np.float32), uniforms, np.full(2, top_k),
                        np.full(2, top_p, np.float32))
        for r in range(2):
            want, margin = reference(logits[r], 1.0, 0.0, float(uniforms[r]), top_k, top_p)
            assert margin <= MARGIN or drawn[r] == want


def test_edges_of_the_draw(sampler: NativeSampler) -> None:
    """Two equal tokens at u = 0.5: the second (the first whose running sum passes the target); a +inf logit:
    that token; a uniform of 1 (float32's rounding of one just under it): the last token of weight, not the
    forbidden one after it."""
    one = np.ones(1, np.float32)
    assert sampler(np.zeros((1, 2), np.float32), one, 0 * one, np.array([0.5]))[0] == 1
    with np.errstate(invalid="ignore"):
        assert sampler(np.array([[0, 1, 5, np.inf, 2]], np.float32), one, 0 * one, np.array([0.3]))[0] == 3
    assert sampler(np.array([[0, 1, 2, -np.inf]], np.float32), one, 0 * one, np.array([1.0]))[0] == 2


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
    with pytest.raises(ValueError, match="positive"):
        sampler(logits, np.ones(2, np.float32), np.zeros(2, np.float32), np.zeros(2), None, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="per row"):
        sampler(logits, np.ones(3, np.float32), np.zeros(2, np.float32), np.zeros(2))


def reference_logprobs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("k", [0, 1, 5, 20])
@pytest.mark.parametrize("vocab", [20, 1003, 262_144])
def test_logprobs_are_the_log_softmax(sampler: NativeSampler, vocab: int, k: int) -> None:
    """The chosen tokens' and the k most likely tokens' log-probabilities, most likely first, within float32's
    rounding of a float64 log-softmax; a -inf logit's is -inf and it is ranked last."""
    rng = np.random.default_rng(vocab + k)
    rows = 3 if vocab > 100_000 else 16
    logits = random_rows(rng, rows, vocab)
    logits[0, :4] = -np.inf
    tokens = rng.integers(0, vocab, rows)
    tokens[0] = 2
    chosen, top_ids, top_values = sampler.logprobs(logits, tokens, k)
    want = reference_logprobs(logits)
    np.testing.assert_allclose(chosen[1:], want[np.arange(1, rows), tokens[1:]], rtol=1e-6, atol=2e-5)
    assert chosen[0] == -np.inf
    if k == 0:
        assert top_ids is None and top_values is None
        return
    assert top_ids is not None and top_values is not None
    order = np.lexsort((np.broadcast_to(np.arange(vocab), want.shape), -want), axis=-1)[:, :k]
    assert top_ids.tolist() == order.tolist()
    np.testing.assert_allclose(top_values, np.take_along_axis(want, order, axis=-1), rtol=1e-6, atol=2e-5)


def test_top_logprobs_ties_go_by_index(sampler: NativeSampler) -> None:
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 3.0, -np.inf, 3.0]], np.float32)
    _, ids, values = sampler.logprobs(logits, np.array([0]), 3)
    assert ids is not None and values is not None
    assert ids.tolist() == [[1, 2, 4]] and len(set(values[0].tolist())) == 1
    _, ids, _ = sampler.logprobs(logits, np.array([0]), 7)
    assert ids is not None and ids.tolist() == [[1, 2, 4, 6, 0, 3, 5]]
    with pytest.raises(ValueError, match="top logprobs"):
        sampler.logprobs(np.zeros((1, 100), np.float32), np.array([0]), 65)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.logprobs(logits, np.array([7]), 1)


class Recording:
    """A row sampler that records what it is handed and draws with the C sampler."""

    def __init__(self, inner: NativeSampler) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, logits: Any, temperature: Any, min_p: Any, uniforms: Any, top_k: Any, top_p: Any) -> Any:
        self.calls.append((logits, temperature, top_k, top_p))
        return self.inner(logits, temperature, min_p, uniforms, top_k, top_p)

    def logprobs(self, logits: Any, tokens: Any, k: int) -> tuple[Any, Any | None, Any | None]:
        self.calls.append(("logprobs", logits, tokens, k))
        return self.inner.logprobs(logits, tokens, k)


def test_sample_hands_the_row_sampler_the_random_rows(tmp_path: Path) -> None:
    """Greedy rows keep the argmax; the random ones, top-k and top-p rows among them, go to the row sampler in
    one call, without a copy of the logits when every row is random."""
    rng = np.random.default_rng(5)
    n, vocab = 8, 3000
    logits = random_rows(rng, n, vocab)
    params = SamplingInputs(temperature=np.array([0, 0.7, 1, 1.2, 0.9, 0, 1.1, 0.8], np.float32),
                            top_k=np.array([0, 0, 40, 0, 0, 0, 0, 0], np.int32),
                            top_p=np.array([1, 1, 1, 0.9, 1, 1, 1, 1], np.float32),
                            min_p=np.array([0, 0.05, 0, 0, 0, 0, 0.1, 0], np.float32),
                            uniforms=rng.random(n).astype(np.float32))
    recording = Recording(NativeSampler(cache_dir=tmp_path))
    ids = sample(np, logits, params, recording).token_ids
    assert len(recording.calls) == 1
    handed, temperatures, top_k, top_p = recording.calls[0]
    random = [1, 2, 3, 4, 6, 7]
    assert np.array_equal(handed, logits[random]) and top_k.tolist() == [0, 40, 0, 0, 0, 0]
    assert temperatures.tolist() == pytest.approx([0.7, 1, 1.2, 0.9, 1.1, 0.8])
    assert top_p.tolist() == pytest.approx([1, 1, 0.9, 1, 1, 1])
    assert ids[[0, 5]].tolist() == logits[[0, 5]].argmax(axis=-1).tolist()
    for r in random:
        token, margin = reference(logits[r], float(params.temperature[r]), float(params.min_p[r]),
                                  float(params.uniforms[r]), int(params.top_k[r]), float(params.top_p[r]))
        assert margin <= MARGIN or ids[r] == token
    plain = SamplingInputs(np.ones(n, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32),
                           np.zeros(n, np.float32), rng.random(n).astype(np.float32))
    sample(np, logits, plain, recording)
    assert recording.calls[1][0] is logits  # the whole batch in one call, not a gathered copy of it


def test_sample_takes_the_logprobs_from_the_row_sampler(tmp_path: Path) -> None:
    """Greedy and random rows asking for logprobs: the row sampler's, over the logits as sampled (a suppressed
    token's is -inf), the values NumPy's sampler gives to float32 rounding."""
    rng = np.random.default_rng(6)
    n, vocab = 4, 3000
    logits = random_rows(rng, n, vocab)
    params = SamplingInputs(temperature=np.array([0, 0.8, 0, 1.0], np.float32), top_k=np.zeros(n, np.int32),
                            top_p=np.ones(n, np.float32), min_p=np.zeros(n, np.float32),
                            uniforms=rng.random(n).astype(np.float32), num_top_logprobs=3, want_logprobs=True,
                            suppressed_token_ids=np.array([[5, -1]] * n))
    recording = Recording(NativeSampler(cache_dir=tmp_path))
    got, want = sample(np, logits, params, recording), sample(np, logits, params)
    assert [call[0] for call in recording.calls if isinstance(call[0], str)] == ["logprobs"]
    assert got.logprobs is not None and got.top_token_ids is not None and got.top_logprobs is not None
    assert want.logprobs is not None and want.top_token_ids is not None and want.top_logprobs is not None
    assert got.token_ids[[0, 2]].tolist() == want.token_ids[[0, 2]].tolist()
    expected = reference_logprobs(np.where(np.arange(vocab) == 5, -np.inf, logits))
    np.testing.assert_allclose(got.logprobs, expected[np.arange(n), got.token_ids], rtol=1e-6, atol=2e-5)
    assert got.top_token_ids.tolist() == want.top_token_ids.tolist()
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, rtol=1e-5, atol=5e-5)
