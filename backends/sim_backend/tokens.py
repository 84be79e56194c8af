"""Deterministic pseudo-random next tokens.

A row's token is a hash of (seed, the last token the sequence fed this step, its position), plus the row's
uniform when it samples. So a request gets the same tokens whatever shares its batch, however its prompt was
chunked, and after a preemption and recompute; and seeded sampling stays reproducible. Tokens are drawn from
the ordinary vocabulary only, so outputs are readable text and never stop on EOS by themselves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from backends.base import AllowedTokens, LongArray, StepBatch
from backends.model.config import ModelConfig
from backends.model.tokenizer import Tokenizer
from backends.sampling import GREEDY_BELOW, allowed_matrix

U64Array = npt.NDArray[np.uint64]

# splitmix64's finaliser: cheap, vectorises, and flips about half the output bits per input bit.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
AVOID_ROUNDS = 16  # re-draws for a row whose token is suppressed; each hits a suppressed id with tiny odds


def mix64(x: U64Array) -> U64Array:
    x = x ^ (x >> np.uint64(30))
    x = x * _MUL1
    x = x ^ (x >> np.uint64(27))
    x = x * _MUL2
    return x ^ (x >> np.uint64(31))


def fold(h: U64Array, value: npt.ArrayLike) -> U64Array:
    """Mix one more input into each row's hash."""
    return mix64(h ^ (np.asarray(value, dtype=np.uint64) + _GOLDEN))


def ordinary_token_ids(tokenizer: Tokenizer, config: ModelConfig) -> LongArray:
    """Ids a model would plausibly emit mid-text: not control/special, not EOS/BOS, and whole UTF-8 on their
    own (byte-fragment tokens would decode to replacement characters when drawn at random)."""
    excluded = set(tokenizer.special_ids) | set(tokenizer.eos_token_ids) | set(config.eos_token_ids)
    excluded |= {tokenizer.bos_token_id, config.bos_token_id}
    limit = min(len(tokenizer.token_bytes), config.vocab_size)
    ids = [i for i in range(limit) if i not in excluded and _is_text(tokenizer.token_bytes[i])]
    return np.array(ids, dtype=np.int64)


def _is_text(raw: bytes) -> bool:
    try:
        return bool(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def row_hashes(batch: StepBatch, seed: int) -> U64Array:
    """(S,) one hash per sampled row, from its last input token and position (and uniform when sampling)."""
    last = batch.sample_token_rows()
    # token ids and positions both fit in 32 bits: pack them into one key, then mix in the seed
    key = (batch.token_ids[last].astype(np.uint64) << np.uint64(32)) | batch.positions[last].astype(np.uint64)
    h = fold(mix64(key), seed & 0xFFFFFFFFFFFFFFFF)
    if batch.sampling is None or h.size == 0:
        return h
    bits = np.asarray(batch.sampling.uniforms, np.float32).view(np.uint32)
    sampled = np.asarray(batch.sampling.temperature, np.float32) >= GREEDY_BELOW
    return np.where(sampled, fold(h, bits), h)


def pick_allowed(hashes: U64Array, allowed: AllowedTokens) -> LongArray:
    """Each constrained row's token: one its grammar allows, chosen by its hash."""
    bits = allowed.bits()
    ok = allowed_matrix(np, bits, bits.shape[1] * 32)
    out = np.zeros(len(hashes), np.int64)
    for i, row in enumerate(ok):
        ids = np.flatnonzero(row)
        out[i] = ids[int(hashes[i] % np.uint64(len(ids)))] if ids.size else 0
    return out


def pick(hashes: U64Array, vocab: LongArray, suppressed: LongArray | None) -> LongArray:
    """Indices into `vocab` for each row, re-drawing rows whose token is one of their suppressed ids."""
    vocab_size = np.uint64(vocab.shape[0])
    index = (hashes % vocab_size).astype(np.int64)
    if suppressed is None:
        return index
    for round_ in range(1, AVOID_ROUNDS + 1):
        clash = (vocab[index][:, None] == suppressed).any(axis=1)
        if not clash.any():
            break
        index[clash] = (fold(hashes[clash], round_) % vocab_size).astype(np.int64)
    return index
