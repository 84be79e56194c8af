"""The sliding layers' K/V in a pool of their own (init_cache's window_blocks; StepBatch's window_tables,
window_slots and window_block_copies): the same steps give the same floats, bit for bit, as with every layer in the
one pool, on the NumPy per-layer path, the C kernels' per-layer path and the fused C step, while the window pool's
blocks wholly before each sequence's window are given back (-1 in its table) and handed to others; and what the
C side refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.base import BackendError, StepBatch
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.attention import decode_attention, prefill_attention
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.kv_cache import PagedKVCache
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.kernels import NativeAttention
from tests.backends.tiny_gguf import GEMMA3_SHAPE, write_tiny_gemma3, write_tiny_llama
from tests.backends.window_pool import WindowPool

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips

BLOCK = 4
WINDOW = GEMMA3_SHAPE.sliding_window  # 8: two blocks
FULL_BLOCKS = 48  # 3 sequences of up to 46 tokens
WINDOW_BLOCKS = 20  # the first step's prompts take 18 of them; later steps give back more than they take
# a step of three prompts (64 rows: the fused step's most), then a chunk continuing the first past its window beside
# two decodes, then decodes: contexts of up to five windows
STEPS = [(30, 21, 13), (10, 1, 1)] + [(1, 1, 1)] * 6
SLIDING = [0, 1, 2, 3, 4, 6]  # of the 7 layers, the sixth is global


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """7 layers (the sixth global), window 8, 4 query heads of 32 over 1 kv head, hidden 64."""
    return load_model(write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf"))


def backend(model: LoadedModel, kernels: str, window_blocks: int = 0, tier: CpuTier | None = None,
            kv_cache_dtype: str = "float32") -> NumpyBackend:
    """kernels: "numpy", "native" (the fused step for these steps) or "per-layer" (the C kernels layer by layer)."""
    made = NumpyBackend(model, "numpy" if kernels == "numpy" else "native", kv_cache_dtype=kv_cache_dtype,
                        cpu_isa=tier.name if tier else "auto")
    if kernels == "per-layer":
        made.forward.fused_step = None
    made.init_cache(FULL_BLOCKS, BLOCK, window_blocks)
    return made


def run(backend: NumpyBackend, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """Every row's final hidden state, and the logits of the sampled rows."""
    hidden = backend.forward.hidden_states(batch, backend.cache)
    return hidden, backend.forward.logits(hidden[batch.sample_token_rows()])


def assert_same_steps(model: LoadedModel, kernels: str, monkeypatch: pytest.MonkeyPatch,
                      tier: CpuTier | None = None, kv_cache_dtype: str = "float32") -> None:
    one = backend(model, kernels, tier=tier, kv_cache_dtype=kv_cache_dtype)
    pooled = backend(model, kernels, WINDOW_BLOCKS, tier, kv_cache_dtype)
    fused_rows = fused_calls(pooled, monkeypatch)
    rng, pool = np.random.default_rng(1), WindowPool(WINDOW_BLOCKS, BLOCK, WINDOW)
    order = [int(b) for b in rng.permutation(FULL_BLOCKS)]
    seqs = [SeqState(blocks=order[16 * i : 16 * (i + 1)]) for i in range(3)]
    minus_ones = 0
    for chunks in STEPS:
        batch = make_batch(seqs, [[int(t) for t in rng.integers(1, 32, n)] for n in chunks], BLOCK)
        placed = pool.place(batch)
        assert placed.window_tables is not None
        minus_ones += int((placed.window_tables == -1).sum())
        for mine, theirs in zip(run(pooled, placed), run(one, batch), strict=True):
            np.testing.assert_array_equal(mine, theirs)
    assert minus_ones > 0 and pool.gave_back > 0 and max(len(s.tokens) for s in seqs) > 5 * WINDOW
    assert fused_rows == ([sum(c) for c in STEPS] if kernels == "native" else [])
    assert_same_kv(one.cache, pooled.cache, seqs, pool)


def fused_calls(backend: NumpyBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the row count of every call the backend makes to the fused C step."""
    step = backend.forward.fused_step
    calls: list[int] = []
    if step is not None:
        inner = step.run

        def counted(x: np.ndarray, *args: Any) -> None:
            calls.append(len(x))
            inner(x, *args)

        monkeypatch.setattr(step, "run", counted)
    return calls


def assert_same_kv(one: PagedKVCache, pooled: PagedKVCache, seqs: list[SeqState], pool: WindowPool) -> None:
    """The full layers' arrays equal; each sliding layer's K/V of every position still in the window pool equal
    to the one pool's."""
    assert pooled.window_layers == frozenset(SLIDING) and not one.window_layers
    for layer in range(len(one.keys)):
        for mine, theirs in ((pooled.keys[layer], one.keys[layer]), (pooled.values[layer], one.values[layer])):
            if layer not in SLIDING:
                np.testing.assert_array_equal(mine, theirs)
                continue
            for seq_id, seq in enumerate(seqs):
                for i, block in pool.blocks[seq_id].items():
                    rows = slice(0, min(BLOCK, len(seq.tokens) - i * BLOCK))
                    np.testing.assert_array_equal(mine[block, rows], theirs[seq.blocks[i], rows])


DTYPES = pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])


@DTYPES
def test_the_numpy_forward_gives_the_one_pools_floats(gemma3: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                      kv_cache_dtype: str) -> None:
    assert_same_steps(gemma3, "numpy", monkeypatch, kv_cache_dtype=kv_cache_dtype)


@DTYPES
def test_the_c_kernels_layer_by_layer_give_the_one_pools_floats(gemma3: LoadedModel,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                kv_cache_dtype: str) -> None:
    assert_same_steps(gemma3, "per-layer", monkeypatch, kv_cache_dtype=kv_cache_dtype)


@DTYPES
def test_the_fused_step_gives_the_one_pools_floats(gemma3: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                   tier: CpuTier, kv_cache_dtype: str) -> None:
    """On every tier this host runs."""
    assert_same_steps(gemma3, "native", monkeypatch, tier, kv_cache_dtype)


# --- what is refused ------------------------------------------------------------------------------------------


def decode_step() -> StepBatch:
    """A decode at position 20 of a sequence whose window (positions 13..20) lies in blocks 3..5; blocks 0..2
    are given back (-1)."""
    batch = make_batch([SeqState(blocks=list(range(6)), tokens=[1] * 20)], [[5]], BLOCK)
    return replace(batch, window_tables=np.array([[-1, -1, -1, 7, 2, 9]], np.int32),
                   window_slots=np.array([9 * BLOCK], np.int64))


@pytest.mark.parametrize("kernels", ["native", "per-layer"])
@pytest.mark.parametrize(("table", "slot", "message"), [
    ([-1, -1, -1, -1, 2, 9], 9 * BLOCK, "outside the cache"),  # a -1 entry inside the window (block 3: 12..15)
    ([-1, -1, -1, 7, 2, WINDOW_BLOCKS], 9 * BLOCK, "outside the cache"),  # a block past the window pool
    ([-1, -1, -1, 7, 2, 9], WINDOW_BLOCKS * BLOCK, "outside the cache"),  # a slot past the window pool
])
def test_a_window_ref_outside_the_window_pool_is_refused(gemma3: LoadedModel, kernels: str, table: list[int],
                                                         slot: int, message: str) -> None:
    """By the fused step (-5) and by the C kernels (-5) before anything is written; the NumPy scatter refuses a
    slot past its arrays too. A slot is checked by the fused step, a table by both."""
    pooled = backend(gemma3, kernels, WINDOW_BLOCKS)
    batch = decode_step()
    pooled.compute_logits(batch)  # -1 before the window passes
    bad = replace(batch, window_tables=np.array([table], np.int32), window_slots=np.array([slot], np.int64))
    before = [k.copy() for k in pooled.cache.keys]
    with pytest.raises((ValueError, IndexError), match=message if kernels == "native" or slot == 9 * BLOCK else None):
        pooled.compute_logits(bad)
    if kernels == "native":
        assert all(np.array_equal(a, b) for a, b in zip(before, pooled.cache.keys, strict=True))


def test_a_window_table_narrower_than_the_context_is_refused(gemma3: LoadedModel) -> None:
    pooled = backend(gemma3, "native", WINDOW_BLOCKS)
    batch = decode_step()
    with pytest.raises(ValueError, match="context length"):
        pooled.compute_logits(replace(batch, window_tables=batch.window_tables[:, :5]))  # type: ignore[index]


def paged(rng: np.random.Generator, context: int, pool: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K/V of `pool` random blocks, and a table of the context's blocks in shuffled order."""
    k, v = (rng.standard_normal((pool, BLOCK, 2, 16), dtype=np.float32) for _ in range(2))
    return k, v, rng.permutation(pool)[: -(-context // BLOCK)].astype(np.int32)


@pytest.fixture(scope="module")
def attention(kernel_cache: Path) -> NativeAttention:
    return NativeAttention(cache_dir=kernel_cache)


@pytest.mark.parametrize("kind", ["decode", "chunk"])
def test_the_c_kernels_read_a_window_from_a_table_given_back_before_it(attention: NativeAttention,
                                                                        kind: str) -> None:
    """-1 before the window: the same floats as with the blocks there, and as the NumPy reference (which gathers
    the last block for -1 and masks it); -1 or a block past the cache inside the window: refused (-5). The chunk's
    first query (position 32 - 5) sees from 20 on: block 5."""
    rng = np.random.default_rng(2)
    context, n, window = 32, 5, 8
    k, v, table = paged(rng, context, 12)
    given_back = table.copy()
    first = context - n if kind == "chunk" else context - 1
    given_back[: (first - window + 1) // BLOCK] = -1
    q = rng.standard_normal((n if kind == "chunk" else 1, 4, 16), dtype=np.float32)

    def c_kernel(t: np.ndarray) -> np.ndarray:
        if kind == "chunk":
            return attention.chunk(q, k, v, t, context, window)
        return attention.decode(q, k, v, t[None], np.array([context], np.int32), window)

    def reference(t: np.ndarray) -> np.ndarray:
        if kind == "chunk":
            return prefill_attention(q, k, v, t, context, window)
        return decode_attention(q, k, v, t[None], np.array([context]), window)

    assert (given_back == -1).sum() == (5 if kind == "chunk" else 6)
    np.testing.assert_array_equal(c_kernel(given_back), c_kernel(table))
    np.testing.assert_array_equal(reference(given_back), reference(table))
    for bad in (-1, 12):
        inside = given_back.copy()
        inside[first // BLOCK - 1 if kind == "decode" else 5] = bad  # the window's first block
        with pytest.raises(ValueError, match="block outside the cache"):
            c_kernel(inside)


def test_the_numpy_reference_never_lets_a_masked_block_through() -> None:
    """Scores outside the window are replaced, not added to: a -1 entry's block (the last) holding inf or NaN
    keys changes nothing."""
    rng = np.random.default_rng(3)
    k, v, _ = paged(rng, 24, 8)
    table = rng.permutation(7)[:6].astype(np.int32)  # the last block is read through -1 only
    table[:2] = -1
    q = rng.standard_normal((1, 4, 16), dtype=np.float32)
    clean = decode_attention(q, k, v, table[None], np.array([24]), 8)
    k[-1] = np.inf
    k[-1, 0] = np.nan
    assert np.isfinite(clean).all()
    with np.errstate(invalid="ignore"):  # the masked scores themselves are NaN
        np.testing.assert_array_equal(decode_attention(q, k, v, table[None], np.array([24]), 8), clean)


# --- copies, sizes and the step's inputs ------------------------------------------------------------------------


def test_window_block_copies_copy_in_the_window_layers_and_block_copies_in_the_others(gemma3: LoadedModel) -> None:
    pooled = backend(gemma3, "numpy", WINDOW_BLOCKS)
    rng = np.random.default_rng(4)
    for array in (*pooled.cache.keys, *pooled.cache.values):
        array[...] = rng.standard_normal(array.shape)
    before = [a.copy() for a in (*pooled.cache.keys, *pooled.cache.values)]
    batch = replace(decode_step(), block_copies=((11, 12),), window_block_copies=((3, 4),))
    pooled.compute_logits(batch)  # writes block 5 of the full pool, block 9 of the window pool
    layers = len(pooled.cache.keys)
    for index, (after, was) in enumerate(zip((*pooled.cache.keys, *pooled.cache.values), before, strict=True)):
        src, dst = (3, 4) if index % layers in SLIDING else (11, 12)
        np.testing.assert_array_equal(after[dst], was[src])
        expected = was.copy()
        expected[dst] = was[src]
        unwritten = np.ones(len(after), bool)
        unwritten[9 if index % layers in SLIDING else 5] = False
        np.testing.assert_array_equal(after[unwritten], expected[unwritten])


def test_copy_blocks_without_a_window_pool_takes_no_window_pairs() -> None:
    cache = PagedKVCache.allocate(2, 4, BLOCK, 1, 8)
    cache.keys[0][1] = 1.0
    cache.copy_blocks([(1, 2)])
    assert (cache.keys[0][2] == 1.0).all()
    with pytest.raises(ValueError, match="without a window pool"):
        cache.copy_blocks([], [(1, 2)])


def test_init_cache_sizes_the_sliding_layers_by_window_blocks(gemma3: LoadedModel) -> None:
    made = NumpyBackend(gemma3, "numpy")
    geometry = made.kv_geometry
    assert (geometry.sliding_window, geometry.window_layers) == (WINDOW, len(SLIDING))
    made.init_cache(FULL_BLOCKS, BLOCK, WINDOW_BLOCKS)
    cache = made.cache
    assert [k.shape[0] for k in cache.keys] == [WINDOW_BLOCKS if i in SLIDING else FULL_BLOCKS for i in range(7)]
    assert [v.shape for v in cache.values] == [k.shape for k in cache.keys]
    assert (cache.num_blocks, cache.window_blocks, cache.window_layers) == (FULL_BLOCKS, WINDOW_BLOCKS,
                                                                              frozenset(SLIDING))
    made.init_cache(FULL_BLOCKS, BLOCK)
    assert {k.shape[0] for k in made.cache.keys} == {FULL_BLOCKS} and made.cache.window_blocks == 0


def test_a_model_without_sliding_layers_has_no_window_pool(tmp_path: Path) -> None:
    llama = NumpyBackend(load_model(write_tiny_llama(tmp_path / "tiny.gguf")), "numpy")
    assert (llama.kv_geometry.sliding_window, llama.kv_geometry.window_layers) == (0, 0)
    with pytest.raises(BackendError, match="without sliding layers"):
        llama.init_cache(16, BLOCK, 8)


def test_the_step_brings_window_tables_exactly_when_the_cache_has_a_window_pool(gemma3: LoadedModel) -> None:
    """A mismatch is a scheduler bug: refused before any block is copied or any K/V written."""
    pooled, one = backend(gemma3, "native", WINDOW_BLOCKS), backend(gemma3, "native")
    placed = decode_step()
    arrays = (*pooled.cache.keys, *pooled.cache.values, *one.cache.keys, *one.cache.values)
    for array in arrays:
        array[0] = 1.0
    for made, batch, message in (
            (pooled, replace(placed, window_tables=None, window_slots=None), "has a window pool"),
            (pooled, replace(placed, window_slots=None), "has a window pool"),
            (one, placed, "has no window pool"),
            (one, replace(placed, window_tables=None, window_slots=None, window_block_copies=((0, 1),)),
             "without a window pool")):
        with pytest.raises(ValueError, match=message):
            made.execute(replace(batch, block_copies=((0, 1),)))
    assert all((array[0] == 1.0).all() and not array[1:].any() for array in arrays)
