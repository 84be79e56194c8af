"""Token sampling next to the logits, written once against an array module `xp` (numpy or cupy), so a GPU
backend never copies full logits to the host.

Randomness comes in as one uniform number per row, drawn from that request's own seeded generator: a row's
token depends on its logits and its uniform only, never on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from backends.base import AllowedTokens, SamplingInputs

GREEDY_BELOW = 1e-5  # temperatures under this are greedy (OpenAI's temperature=0)
TOP_CANDIDATES = 256  # sorted candidates tried first for top-p; a row whose top-p mass lies beyond falls back


@dataclass(frozen=True)
class SampleResult:
    token_ids: Any  # (S,) int64
    logprobs: Any | None  # (S,) float32: the sampled token's logprob under the model's distribution
    top_token_ids: Any | None  # (S, k)
    top_logprobs: Any | None  # (S, k)


class RowSampler(Protocol):
    """A backend's own kernels for random rows and for logprobs. Called, it draws one token a row by inverse CDF
    over temperature-scaled weights of the whole vocabulary, filtered by min-p, top-k (0: off) and top-p (1: off),
    from the row's uniform; `logprobs` gives the rows' log-softmax at their tokens and their k most likely."""

    def __call__(self, logits: Any, temperature: Any, min_p: Any, uniforms: Any, top_k: Any,
                 top_p: Any) -> Any: ...

    def logprobs(self, logits: Any, tokens: Any, k: int) -> tuple[Any, Any | None, Any | None]: ...


def sample(xp: Any, logits: Any, params: SamplingInputs, row_sampler: RowSampler | None = None) -> SampleResult:
    """row_sampler: draws the random rows and gives the logprobs in place of this module's sampler."""
    logits = apply_penalties(xp, logits.astype(xp.float32, copy=False), params)  # never writes to `logits`
    if params.allowed is not None:
        logits = apply_allowed(xp, logits, params.allowed)
    want_logprobs = params.want_logprobs or params.num_top_logprobs > 0
    logprobs = log_softmax(xp, logits) if want_logprobs and row_sampler is None else None
    temperature = xp.asarray(params.temperature, dtype=xp.float32)
    random_rows = xp.flatnonzero(temperature >= GREEDY_BELOW)
    every_row_random = random_rows.size == logits.shape[0]  # then no argmax pass over the vocabulary
    token_ids = xp.empty(logits.shape[0], dtype=xp.int64) if every_row_random else greedy_tokens(xp, logits)
    if random_rows.size:  # every row random: the logits as they are, not a gathered copy of them
        rows_logits = logits if every_row_random else logits[random_rows]
        token_ids[random_rows] = _sample_random(xp, rows_logits, _rows(xp, params, random_rows), row_sampler)
    if not want_logprobs:
        return SampleResult(token_ids, None, None, None)
    if row_sampler is not None:  # its logprobs: no log-softmax of the rows' size
        return SampleResult(token_ids, *row_sampler.logprobs(logits, token_ids, params.num_top_logprobs))
    chosen = xp.take_along_axis(logprobs, token_ids[:, None], axis=-1)[:, 0]
    top_ids, top_values = top_logprobs(xp, logprobs, params.num_top_logprobs)
    return SampleResult(token_ids, chosen, top_ids, top_values)


def greedy_tokens(xp: Any, logits: Any) -> Any:
    return xp.argmax(logits, axis=-1).astype(xp.int64)


def apply_allowed(xp: Any, logits: Any, allowed: AllowedTokens) -> Any:
    """A copy of `logits` with every token a row's grammar forbids at -inf (constrained rows only)."""
    rows = xp.asarray(allowed.positions, dtype=xp.int64)
    ok = allowed_matrix(xp, xp.asarray(allowed.bits()), logits.shape[-1])
    if rows.shape[0] == logits.shape[0]:  # every row constrained (positions are ascending): no gather
        return xp.where(ok, logits, xp.float32(-xp.inf))
    out = logits.copy()
    out[rows] = xp.where(ok, logits[rows], xp.float32(-xp.inf))
    return out


def allowed_matrix(xp: Any, bits: Any, vocab: int) -> Any:
    """(R, vocab) bool from (R, W) int32 bitmasks: bit j of word w is token 32 * w + j."""
    if xp.__name__ == "numpy":  # little-endian words: byte-wise little bit order is the same numbering
        ok = xp.unpackbits(xp.ascontiguousarray(bits).view(xp.uint8), axis=1, bitorder="little").view(xp.bool_)
    else:  # cupy's unpackbits has neither axis nor bit order
        shifts = xp.arange(32, dtype=xp.int32)
        ok = ((bits[:, :, None] >> shifts) & 1).astype(xp.bool_).reshape(bits.shape[0], -1)
    if ok.shape[1] >= vocab:
        return ok[:, :vocab]
    return xp.concatenate([ok, xp.zeros((ok.shape[0], vocab - ok.shape[1]), dtype=xp.bool_)], axis=1)


def log_softmax(xp: Any, logits: Any) -> Any:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


def top_logprobs(xp: Any, logprobs: Any, k: int) -> tuple[Any | None, Any | None]:
    if k <= 0:
        return None, None
    part = xp.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    values = xp.take_along_axis(logprobs, part, axis=-1)
    order = xp.argsort(-values, axis=-1)
    return xp.take_along_axis(part, order, axis=-1), xp.take_along_axis(values, order, axis=-1)


def apply_penalties(xp: Any, logits: Any, p: SamplingInputs) -> Any:
    """Repetition (prompt and output, multiplicative), then frequency and presence (output counts). Returns a
    new array when a penalty applies and `logits` itself when none does (no copy of a batch's logits)."""
    if p.repetition_penalty is not None and (p.prompt_token_ids is not None or p.output_token_ids is not None):
        seen = _token_counts(xp, logits.shape, p.prompt_token_ids, p.output_token_ids) > 0
        penalty = xp.asarray(p.repetition_penalty, dtype=xp.float32)[:, None]
        scaled = xp.where(logits > 0, logits / penalty, logits * penalty)
        logits = xp.where(seen, scaled, logits)
    if p.output_token_ids is not None and (p.frequency_penalty is not None or p.presence_penalty is not None):
        counts = _token_counts(xp, logits.shape, p.output_token_ids)
        if p.frequency_penalty is not None:
            logits = logits - xp.asarray(p.frequency_penalty, dtype=xp.float32)[:, None] * counts
        if p.presence_penalty is not None:
            logits = logits - xp.asarray(p.presence_penalty, dtype=xp.float32)[:, None] * (counts > 0)
    if p.suppressed_token_ids is not None:
        mask = _token_counts(xp, logits.shape, p.suppressed_token_ids) > 0
        logits = xp.where(mask, xp.float32(-xp.inf), logits)
    return logits


def _token_counts(xp: Any, shape: tuple[int, int], *id_arrays: Any) -> Any:
    """(S, V) float32 occurrence counts of the ids in padded (S, L) arrays (padding is -1)."""
    rows, vocab = shape
    counts = xp.zeros((rows, vocab + 1), dtype=xp.float32)  # column `vocab` soaks up the padding
    for ids in id_arrays:
        if ids is None:
            continue
        ids = xp.asarray(ids, dtype=xp.int64)
        ids = xp.where(ids < 0, vocab, ids)
        row_ix = xp.broadcast_to(xp.arange(rows)[:, None], ids.shape)
        _scatter_add(xp, counts, (row_ix.ravel(), ids.ravel()), 1.0)
    return counts[:, :vocab]


def _scatter_add(xp: Any, target: Any, index: tuple[Any, Any], value: float) -> None:
    if xp.__name__ == "numpy":
        xp.add.at(target, index, value)
    else:  # cupy
        import cupyx  # noqa: PLC0415 - only reached on the GPU backend

        cupyx.scatter_add(target, index, value)


@dataclass(frozen=True)
class _RowParams:
    temperature: Any
    top_k: Any
    top_p: Any
    min_p: Any
    uniforms: Any


def _rows(xp: Any, p: SamplingInputs, rows: Any) -> _RowParams:
    def pick(values: Any, dtype: Any) -> Any:
        return xp.asarray(values, dtype=dtype)[rows]

    return _RowParams(pick(p.temperature, xp.float32), pick(p.top_k, xp.int64), pick(p.top_p, xp.float32),
                      pick(p.min_p, xp.float32), pick(p.uniforms, xp.float64))


def _sample_random(xp: Any, logits: Any, p: _RowParams, row_sampler: RowSampler | None) -> Any:
    if row_sampler is None:
        return _sample_rows(xp, logits, p)
    return row_sampler(logits, p.temperature, p.min_p, p.uniforms, p.top_k, p.top_p)


def _sample_rows(xp: Any, logits: Any, p: _RowParams) -> Any:
    """Sample one token per row from temperature-scaled, filtered probabilities by inverse CDF."""
    probs = _softmax(xp, logits / p.temperature[:, None])
    if bool((p.min_p > 0).any()):  # with min_p 0 the filter keeps every token: four passes over the vocabulary saved
        probs = xp.where(probs >= (p.min_p * probs.max(axis=-1))[:, None], probs, 0.0)
    filtered = (p.top_k > 0) | (p.top_p < 1.0)
    if bool(filtered.all()):  # no row for the plain draw: its cumulative sum over the vocabulary saved
        return _sample_filtered(xp, probs, p.top_k, p.top_p, p.uniforms)
    out = _inverse_cdf(xp, probs, p.uniforms)  # rows without top-k/top-p: any token order will do
    rows = xp.flatnonzero(filtered)
    if rows.size:
        out[rows] = _sample_filtered(xp, probs[rows], p.top_k[rows], p.top_p[rows], p.uniforms[rows])
    return out


def _sample_filtered(xp: Any, probs: Any, top_k: Any, top_p: Any, uniforms: Any) -> Any:
    """Top-k/top-p rows: sort only the top candidates; a row whose top-p mass reaches beyond them is
    redone over the whole sorted vocabulary (exact, and rare)."""
    vocab = probs.shape[-1]
    width = int(min(vocab, max(TOP_CANDIDATES, int(top_k.max()))))
    picked = _sample_top(xp, probs, top_k, top_p, uniforms, width)
    missing = xp.flatnonzero(picked < 0)
    if missing.size:
        picked[missing] = _sample_top(xp, probs[missing], top_k[missing], top_p[missing], uniforms[missing], vocab)
    return picked


def _sample_top(xp: Any, probs: Any, top_k: Any, top_p: Any, uniforms: Any, width: int) -> Any:
    vocab = probs.shape[-1]
    ids = xp.argpartition(-probs, width - 1, axis=-1)[:, :width] if width < vocab else None
    cand = probs if ids is None else xp.take_along_axis(probs, ids, axis=-1)
    order = xp.argsort(-cand, axis=-1)
    cand = xp.take_along_axis(cand, order, axis=-1)
    ids = order if ids is None else xp.take_along_axis(ids, order, axis=-1)
    total = probs.sum(axis=-1, keepdims=True)
    mass_before = (xp.cumsum(cand, axis=-1) - cand) / total
    rank = xp.arange(width)[None, :]
    keep = (mass_before < top_p[:, None]) & ((top_k[:, None] <= 0) | (rank < top_k[:, None]))
    picked = xp.take_along_axis(ids, _inverse_cdf(xp, xp.where(keep, cand, 0.0), uniforms)[:, None], axis=-1)
    if width == vocab:
        return picked[:, 0]
    # Complete when the candidates hold the whole top-p mass, or top-k (<= width) bounds the row anyway.
    complete = (cand.sum(axis=-1) / total[:, 0] >= top_p) | (top_k > 0)
    return xp.where(complete, picked[:, 0], -1)  # -1: leave to the full-vocabulary pass


def _inverse_cdf(xp: Any, weights: Any, uniforms: Any) -> Any:
    """Per row, the first index whose cumulative weight exceeds uniform * total: how many cumulative weights are
    at most the target (a binary search per row on NumPy, where comparing and counting the whole vocabulary
    cost two more passes over it; cupy has no row-wise search, and counts)."""
    cdf = xp.cumsum(weights.astype(xp.float64), axis=-1)
    targets = cdf_targets(xp, cdf, uniforms)
    if xp.__name__ == "numpy":
        index = xp.array([xp.searchsorted(row, target, side="right") for row, target in zip(cdf, targets, strict=True)],
                         dtype=xp.int64).reshape(len(cdf))
    else:
        index = (cdf <= targets[:, None]).sum(axis=-1)
    return xp.minimum(index, weights.shape[-1] - 1).astype(xp.int64)


def cdf_targets(xp: Any, cdf: Any, uniforms: Any) -> Any:
    """uniform * total per row, always under the total: a float32 uniform can round up to 1, and a count of the
    cumulative weights at most the target would then run past the last token of weight onto the filtered or
    forbidden ones after it."""
    return xp.minimum(uniforms * cdf[:, -1], xp.nextafter(cdf[:, -1], 0.0))


def _softmax(xp: Any, x: Any) -> Any:
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
