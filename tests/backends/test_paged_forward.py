"""The paged forward gives the same logits however a prompt is split, batched or laid out in blocks."""

from __future__ import annotations

import numpy as np
import pytest

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel
from backends.numpy_backend.backend import NumpyBackend

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]
# logits up to 37 (so 3e-6 of the largest): block size and batching change the float32 summation order only;
# measured up to 2.1e-5 (AVX2 host)
TOL = 1e-4


@pytest.fixture(scope="module")
def model(real_model: LoadedModel) -> LoadedModel:
    return real_model  # loaded once for the session (tests/conftest.py)


def backend(model: LoadedModel, num_blocks: int, block_size: int) -> NumpyBackend:
    b = NumpyBackend(model)
    b.init_cache(num_blocks, block_size)
    return b


def one_shot(model: LoadedModel, ids: list[int], block_size: int = 16) -> np.ndarray:
    b = backend(model, 64, block_size)
    seq = SeqState(blocks=list(range(-(-len(ids) // block_size))))
    return b.compute_logits(make_batch([seq], [ids], block_size))[0]


def shuffled_blocks(n: int, total: int, seed: int) -> list[int]:
    return [int(b) for b in np.random.default_rng(seed).permutation(total)[:n]]


def test_prompt_in_chunks_of_seven_matches_one_shot(model: LoadedModel) -> None:
    ids = model.files.tokenizer.encode(PROMPTS[1])
    b = backend(model, 64, 16)
    seq = SeqState(blocks=shuffled_blocks(-(-len(ids) // 16), 64, 1))
    for start in range(0, len(ids), 7):
        logits = b.compute_logits(make_batch([seq], [ids[start : start + 7]], 16))[0]
    np.testing.assert_allclose(logits, one_shot(model, ids), atol=TOL, rtol=0)


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_block_size_does_not_change_logits(model: LoadedModel, block_size: int) -> None:
    ids = model.files.tokenizer.encode(PROMPTS[2])
    np.testing.assert_allclose(one_shot(model, ids, block_size), one_shot(model, ids, 16), atol=TOL, rtol=0)


def test_mixed_batch_of_prefills_and_decodes_with_shuffled_tables(model: LoadedModel) -> None:
    """Three sequences at different lengths share steps: a decode, a prefill chunk, a fresh prompt."""
    tok = model.files.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    block_size, total = 4, 96
    b = backend(model, total, block_size)
    order = shuffled_blocks(total, total, 7)
    seqs = [SeqState(blocks=order[i * 32 : (i + 1) * 32]) for i in range(3)]
    b.compute_logits(make_batch([seqs[0]], [prompts[0][:-1]], block_size))  # seq 0: all but its last token
    b.compute_logits(make_batch([seqs[1]], [prompts[1][:10]], block_size))  # seq 1: a first chunk
    # one step: seq 0 decodes its last prompt token, seq 1 prefills the rest, seq 2 its whole prompt
    logits = b.compute_logits(make_batch(seqs, [prompts[0][-1:], prompts[1][10:], prompts[2]], block_size))
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(logits[row], one_shot(model, ids), atol=TOL, rtol=0)


def test_batched_decode_matches_single_sequence_decode(model: LoadedModel) -> None:
    tok = model.files.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    b = backend(model, 96, 16)
    seqs = [SeqState(blocks=shuffled_blocks(6, 96, 11)[i * 2 : i * 2 + 2]) for i in range(3)]
    for seq, ids in zip(seqs, prompts, strict=True):
        b.compute_logits(make_batch([seq], [ids[:-1]], 16))
    batched = b.compute_logits(make_batch(seqs, [ids[-1:] for ids in prompts], 16))
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(batched[row], one_shot(model, ids), atol=TOL, rtol=0)
