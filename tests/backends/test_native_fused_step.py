"""The fused C step (native/fused_step.c) against the NumPy forward it replaces for small steps (decode tokens
and short prefill chunks): the logits, the K/V it writes to the paged cache, batch invariance, and the checks
that guard the cache; for Llama's layer and for Gemma 3's (a tiny random one, and the real 270M model)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import pytest

from backends.base import StepBatch
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel, load_model
from backends.model.quant import Matrix, QuantMatrix, dense
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.fused_step import STORED_MAX_ROWS, NativeFusedStep
from backends.numpy_backend.native.kernels import NativeAttention
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from tests.backends.bounds import forward_bound
from tests.backends.tiny_gguf import TinyShape, write_tiny_gemma3, write_tiny_llama

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
TOL = 1e-4  # the K/V: float32 summation order only, as the paged-forward tests
# The logits: the NumPy reference is itself only reproducible to about 1e-4 here. Its logits for the seven
# sequences at block size 16 move by 1.1e-4 between two OpenBLAS kernels (Haswell and SkylakeX), so comparing
# a different summation order at 1e-4 failed on one machine and passed on another.
LOGITS_TOL = 3e-4


@dataclass(frozen=True)
class Tolerances:
    kv: float = TOL
    kv_rtol: float = 0.0
    logits: float = LOGITS_TOL


# Over a float16 cache a value near a rounding tie may round the other way on the two sides (their float32 sums
# differ in order): a move of up to 2^-10 of the value, not float32's 2^-24, which the layers after it carry on.
# Seen on the default model: K/V up to 8e-3 apart (one rounding of a value in [8, 16)), logits 6.5e-3 apart (9.7e-3
# in test_kv_float16's decode check, AVX2 host: 2e-2 is 2x that). A value in the wrong slot, or read as the wrong
# type, is off by far more.
HALF_TOLERANCES = Tolerances(kv=1e-2, kv_rtol=2.0**-9, logits=2e-2)


@pytest.fixture(scope="module")
def model(real_model: LoadedModel) -> LoadedModel:
    return real_model


def cut(model: LoadedModel, layers: int = 2, vocab: int = 1024) -> LoadedModel:
    """The model's first `layers` layers and `vocab` tokens (embedding and head rows): each layer's matrices,
    types and shapes, its norms and its attention heads are the whole model's, so a step runs the same kernels'
    paths on the same weights, at a fifteenth of the whole model's cost."""
    weights = model.weights

    def rows(matrix: Matrix) -> Matrix:
        if isinstance(matrix, QuantMatrix):
            return QuantMatrix(matrix.qtype, (vocab, matrix.shape[1]), matrix.data[:vocab])
        return matrix[:vocab]

    embedding = rows(weights.embedding)
    head = embedding if weights.lm_head is weights.embedding else rows(weights.lm_head)
    config = replace(model.config, num_layers=layers, vocab_size=vocab)
    return replace(model, files=replace(model.files, config=config),
                   weights=replace(weights, layers=weights.layers[:layers], embedding=embedding, lm_head=head))


@pytest.fixture(scope="module")
def cut_model(model: LoadedModel) -> LoadedModel:
    return cut(model)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """Another head shape: 4 query heads over 2 kv heads of 16 dims, hidden 64, feed-forward 128."""
    return load_model(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", shape=TinyShape(ffn=128)))


class Pair:
    """The NumPy reference backend and the fused one, with the same paged cache."""

    def __init__(self, model: LoadedModel, num_blocks: int, block_size: int, seed: int = 0,
                 kv_cache_dtype: str = "float32", tier: CpuTier | None = None,
                 float32_copy: LoadedModel | None = None) -> None:
        """tier: the CPU tier the fused backend's kernels are built for; None: the host's own. float32_copy: the
        same model with its stored weights dequantized at load, for the reference, which then computes the same
        floats (test_the_numpy_reference_reads_stored_weights_as_their_float32_copy) without dequantizing every
        matrix at every step."""
        isa = tier.name if tier is not None else "auto"
        self.reference, self.fused = (NumpyBackend(weights, kernels, kv_cache_dtype=kv_cache_dtype, cpu_isa=isa)
                                      for weights, kernels in ((float32_copy or model, "numpy"), (model, "native")))
        self.tolerances = HALF_TOLERANCES if kv_cache_dtype == "float16" else Tolerances()
        for backend in (self.reference, self.fused):
            backend.init_cache(num_blocks, block_size)
        self.block_size, self.num_blocks, self.rng = block_size, num_blocks, np.random.default_rng(seed)

    def decode_batch(self, lens: list[int]) -> StepBatch:
        """One decode token for each sequence, whose context (the new token included) is lens[i] long."""
        return self.step_batch([n - 1 for n in lens], [1] * len(lens))

    def step_batch(self, prefixes: list[int], chunks: list[int]) -> StepBatch:
        """A step in which sequence i, with prefixes[i] tokens already cached, processes chunks[i] new ones
        (random tokens): the reference prefills the prefixes, the fused backend gets a copy of its cache. Block
        tables are drawn at random from the whole pool."""
        order = [int(b) for b in self.rng.permutation(self.num_blocks)]
        seqs, taken = [], 0
        for prefix, chunk in zip(prefixes, chunks, strict=True):
            seqs.append(SeqState(blocks=order[taken : taken + -(-(prefix + chunk) // self.block_size)]))
            taken += len(seqs[-1].blocks)
            if prefix:
                self.reference.compute_logits(make_batch([seqs[-1]], [self.tokens(prefix)], self.block_size))
        for ref, fused in zip((*self.reference.cache.keys, *self.reference.cache.values),
                              (*self.fused.cache.keys, *self.fused.cache.values), strict=True):
            fused[...] = ref
        return make_batch(seqs, [self.tokens(c) for c in chunks], self.block_size)

    def tokens(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(1, self.reference.model.config.vocab_size, n)]

    def fused_calls(self, monkeypatch: pytest.MonkeyPatch) -> list[int]:
        """Records the row count of every call the fused backend makes to the C step."""
        step = self.fused.forward.fused_step
        assert step is not None
        calls: list[int] = []
        inner = step.run
        monkeypatch.setattr(step, "run", lambda x, *args: (calls.append(len(x)), inner(x, *args))[1])
        return calls


def assert_same_step(pair: Pair, batch: StepBatch) -> None:
    """The logits, and the K/V both wrote, within the pair's tolerances."""
    tol = pair.tolerances
    np.testing.assert_allclose(pair.fused.compute_logits(batch), pair.reference.compute_logits(batch),
                               atol=tol.logits, rtol=0)
    for name in ("keys", "values"):
        for fused, ref in zip(getattr(pair.fused.cache, name), getattr(pair.reference.cache, name), strict=True):
            np.testing.assert_allclose(fused.astype(np.float32), ref.astype(np.float32), atol=tol.kv,
                                       rtol=tol.kv_rtol)


SEVEN_LENS = [1, 9, 16, 17, 100, 255, 33]  # 7 rows: a register block of 4 and 3 left over


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("lens", [[200], SEVEN_LENS], ids=["one", "seven"])
def test_matches_numpy_forward(cut_model: LoadedModel, monkeypatch: pytest.MonkeyPatch, block_size: int,
                               lens: list[int]) -> None:
    """The default model cut to two layers (cut()), sequences at mixed lengths."""
    assert_decodes_match(cut_model, monkeypatch, block_size, lens)


def test_the_whole_default_model_matches_numpy_forward(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """All its layers and its whole head: seven sequences at mixed lengths, blocks of 16."""
    assert_decodes_match(model, monkeypatch, 16, SEVEN_LENS)


def assert_decodes_match(model: LoadedModel, monkeypatch: pytest.MonkeyPatch, block_size: int,
                         lens: list[int]) -> None:
    pair = Pair(model, 2048 // block_size, block_size)
    calls = pair.fused_calls(monkeypatch)
    assert_same_step(pair, pair.decode_batch(lens))
    assert calls == [len(lens)]


@pytest.mark.parametrize("block_size", [1, 16])
def test_prefill_chunks_and_decodes_in_one_step(model: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                block_size: int) -> None:
    """A decode, a chunk continuing a cached prefix, a whole new prompt and another decode: 29 rows, each chunk
    token attending to its sequence's cache up to its own position."""
    pair = Pair(model, 1024 // block_size, block_size)
    calls = pair.fused_calls(monkeypatch)
    assert_same_step(pair, pair.step_batch([40, 17, 0, 100], [1, 7, 20, 1]))
    assert calls == [29]


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])
def test_a_long_prompt_takes_the_per_layer_path(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                kv_cache_dtype: str, tier: CpuTier) -> None:
    pair = Pair(tiny, 256, 4, kv_cache_dtype=kv_cache_dtype, tier=tier)
    calls = pair.fused_calls(monkeypatch)
    assert_same_step(pair, pair.step_batch([0, 3], [64, 1]))  # 65 rows
    assert calls == []


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 64, 65])
def test_other_head_shape_and_batch_sizes(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, rows: int,
                                          kv_cache_dtype: str, tier: CpuTier) -> None:
    """Group of 2, head_dim 16 (the unspecialised attention path); 65 rows take the per-layer path. On every
    tier this host runs."""
    pair = Pair(tiny, 1024, 4, seed=rows, kv_cache_dtype=kv_cache_dtype, tier=tier)
    calls = pair.fused_calls(monkeypatch)
    lens = [int(n) for n in pair.rng.integers(1, 60, rows)]
    assert_same_step(pair, pair.decode_batch(lens))
    assert calls == ([rows] if rows <= 64 else [])


def test_a_rows_logits_do_not_depend_on_the_batch(tiny: LoadedModel, tier: CpuTier) -> None:
    """Bit for bit, on every tier: the projections sum a row the same way for any row count, attention is per
    sequence."""
    pair = Pair(tiny, 512, 8, tier=tier)
    batch = pair.decode_batch([5, 40, 23, 7, 64, 12, 33])
    together = pair.fused.compute_logits(batch)
    for row in range(7):
        alone = pair.fused.compute_logits(single_row(batch, row))
        np.testing.assert_array_equal(alone[0], together[row])


def single_row(batch: StepBatch, row: int) -> StepBatch:
    """The step of `batch`'s decode row `row` alone."""
    rows = slice(row, row + 1)
    return replace(batch, seq_ids=batch.seq_ids[rows], token_ids=batch.token_ids[rows],
                   positions=batch.positions[rows], slot_mapping=batch.slot_mapping[rows],
                   query_start=np.array([0, 1], np.int32), context_lens=batch.context_lens[rows],
                   block_tables=batch.block_tables[rows], sample_rows=np.array([0], np.int32), sampling=None)


@pytest.fixture
def step_and_cache(tiny: LoadedModel) -> Iterator[tuple[NativeFusedStep, NumpyBackend]]:
    backend = NumpyBackend(tiny, "native")
    backend.init_cache(16, 4)
    assert backend.forward.fused_step is not None
    yield backend.forward.fused_step, backend


def run_one(step: NativeFusedStep, backend: NumpyBackend, slot: int, table: list[int], context: int) -> None:
    cfg = backend.model.config
    x = np.ones((1, cfg.hidden_size), np.float32)
    angles = np.zeros((1, cfg.head_dim // 2), np.float32)
    step.run(x, backend.cache, angles + 1, angles, np.array([slot]), np.array([table], np.int32),
             np.array([context], np.int32))


@pytest.mark.parametrize(("slot", "table", "context", "message"), [
    (64, [0, 1], 5, "outside the cache"),  # 16 blocks of 4: slots 0..63
    (5, [0, 16], 5, "outside the cache"),  # a block id past the pool
    (5, [0, -1], 5, "outside the cache"),
    (5, [0, 1], 9, "context length"),  # two blocks of 4 hold 8 tokens
    (5, [0, 1], 0, "context length"),
])
def test_refuses_what_would_read_or_write_outside_the_cache(
        step_and_cache: tuple[NativeFusedStep, NumpyBackend], slot: int, table: list[int], context: int,
        message: str) -> None:
    step, backend = step_and_cache
    before = [k.copy() for k in backend.cache.keys]
    with pytest.raises(ValueError, match=message):
        run_one(step, backend, slot, table, context)
    assert all(np.array_equal(a, b) for a, b in zip(before, backend.cache.keys, strict=True))


def test_a_padding_slot_is_not_stored(step_and_cache: tuple[NativeFusedStep, NumpyBackend]) -> None:
    step, backend = step_and_cache
    run_one(step, backend, -1, [0, 1], 5)
    assert not any(k.any() or v.any() for k, v in zip(backend.cache.keys, backend.cache.values, strict=True))
    run_one(step, backend, 5, [0, 1], 6)
    assert all(k.reshape(-1, k.shape[2] * k.shape[3])[5].any() for k in backend.cache.keys)


def test_checks_its_inputs(step_and_cache: tuple[NativeFusedStep, NumpyBackend]) -> None:
    step, backend = step_and_cache
    with pytest.raises(ValueError, match="one row each"):
        step.run(np.ones((2, 64), np.float32), backend.cache, *[np.zeros((1, 8), np.float32)] * 2,
                 np.array([1]), np.zeros((1, 2), np.int32), np.array([1], np.int32))
    with pytest.raises(ValueError, match="writable float32"):
        run_x = np.ones((1, 64), np.float64)
        step.run(run_x, backend.cache, *[np.zeros((1, 8), np.float32)] * 2, np.array([1]),
                 np.zeros((1, 2), np.int32), np.array([1], np.int32))


def test_times_its_stages(step_and_cache: tuple[NativeFusedStep, NumpyBackend]) -> None:
    step, backend = step_and_cache
    run_one(step, backend, 5, [0, 1], 6)
    assert step.last_seconds.shape == (3,) and (step.last_seconds > 0).all()


def test_refuses_angles_of_the_wrong_width(step_and_cache: tuple[NativeFusedStep, NumpyBackend]) -> None:
    """C reads head_dim / 2 angles per row: a narrower array would be read past its end."""
    step, backend = step_and_cache
    with pytest.raises(ValueError, match="head_dim / 2 wide"):
        step.run(np.ones((1, 64), np.float32), backend.cache, *[np.zeros((1, 1), np.float32)] * 2, np.array([5]),
                 np.array([[0, 1]], np.int32), np.array([6], np.int32))


def test_a_replaced_cache_array_is_written_not_the_freed_one(
        step_and_cache: tuple[NativeFusedStep, NumpyBackend]) -> None:
    """The per-layer pointers are taken again when an array of the cache is no longer the one they came from."""
    step, backend = step_and_cache
    run_one(step, backend, 5, [0, 1], 6)
    backend.cache.keys[0] = np.zeros_like(backend.cache.keys[0])
    run_one(step, backend, 5, [0, 1], 6)
    assert backend.cache.keys[0].reshape(-1, 32)[5].any()


@pytest.fixture(scope="module")
def stored_model(real_model_stored: LoadedModel) -> LoadedModel:
    return real_model_stored


@pytest.fixture(scope="module")
def cut_stored(stored_model: LoadedModel) -> LoadedModel:
    return cut(stored_model)


def dequantized(model: LoadedModel) -> LoadedModel:
    """The model with each stored matrix replaced by gguf's float32 values of it (quant.dense): what the NumPy
    reference computes from the stored matrix at each use, computed once."""
    weights = model.weights
    layers = tuple(replace(layer, **{f.name: dense(m) for f in fields(layer)
                                     if isinstance(m := getattr(layer, f.name), QuantMatrix)})
                   for layer in weights.layers)
    embedding = dense(weights.embedding)
    head = embedding if weights.lm_head is weights.embedding else dense(weights.lm_head)
    return replace(model, weights=replace(weights, embedding=embedding, layers=layers, lm_head=head))


def assert_same_reference(stored_model: LoadedModel, copy: LoadedModel) -> None:
    """The NumPy forward over the stored weights and over a float32 copy of them: the same logits and K/V, bit
    for bit, on a step of two prompts."""
    stored, copied = (NumpyBackend(weights, "numpy") for weights in (stored_model, copy))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(1, copy.config.vocab_size, n)] for n in (19, 7)]
    batch = make_batch([SeqState(blocks=[3, 1]), SeqState(blocks=[6])], prompts, 16)
    for backend in (stored, copied):
        backend.init_cache(8, 16)
    np.testing.assert_array_equal(stored.compute_logits(batch), copied.compute_logits(batch))
    for mine, theirs in zip((*stored.cache.keys, *stored.cache.values), (*copied.cache.keys, *copied.cache.values),
                            strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_the_numpy_reference_reads_stored_weights_as_their_float32_copy(model: LoadedModel,
                                                                      stored_model: LoadedModel) -> None:
    """The NumPy forward over the stored weights (gguf's dequantization of each matrix as it is used) and over
    the float32 copy made at load (the same dequantization, once) give the same floats. So a Pair's reference
    may run on the copy."""
    assert_same_reference(stored_model, model)


def test_the_numpy_reference_reads_stored_weights_as_dequantized_gives_them(tmp_path: Path) -> None:
    """The same of dequantized()'s copy, on the tiny Gemma 3 as stored (Q8_0, its embedding tied to the head:
    the lookup reads rows of the stored matrix, the copy indexes gguf's values of the whole)."""
    stored = load_model(write_tiny_gemma3(tmp_path / "tiny-gemma3.gguf"), stored=STORED_TYPES)
    assert isinstance(stored.weights.embedding, QuantMatrix) and stored.weights.lm_head is stored.weights.embedding
    assert_same_reference(stored, dequantized(stored))


SEVEN_DECODES = ([9, 16, 100, 255, 33, 1, 17], [1] * 7)


@pytest.mark.parametrize(("prefixes", "chunks"), [([0], [5]), SEVEN_DECODES, ([40, 17, 0, 100], [1, 7, 20, 1]),
                                                  ([0, 3], [520, 1])],
                         ids=["prompt", "seven decodes", "mixed", "per-layer path"])
def test_weights_as_stored_give_the_float32_copys_floats(cut_model: LoadedModel, cut_stored: LoadedModel,
                                                         prefixes: list[int], chunks: list[int]) -> None:
    """The default model's Q4_1 layers and Q8_0 head read as stored, against the same model dequantized to
    float32 at load, both cut to two layers (cut()): the same logits and K/V, bit for bit, on the fused step and
    on the per-layer path, where the stored weights are summed in 8 lanes; within float32 rounding of them where
    in 16 (AVX-512)."""
    assert_stored_gives_the_copys_floats(cut_model, cut_stored, prefixes, chunks)


def test_the_whole_default_models_stored_weights_give_the_float32_copys_floats(model: LoadedModel,
                                                                              stored_model: LoadedModel) -> None:
    """All its layers and its whole head, seven decodes."""
    assert_stored_gives_the_copys_floats(model, stored_model, *SEVEN_DECODES)


def assert_stored_gives_the_copys_floats(model: LoadedModel, stored_model: LoadedModel, prefixes: list[int],
                                         chunks: list[int]) -> None:
    pair = Pair(model, 512, 16)
    stored = NumpyBackend(stored_model, "native")
    stored.init_cache(512, 16)
    batch = pair.step_batch(prefixes, chunks)
    for mine, theirs in zip((*stored.cache.keys, *stored.cache.values),
                            (*pair.fused.cache.keys, *pair.fused.cache.values), strict=True):
        mine[...] = theirs
    # 16 lanes against 8: float32 summation order only, as LOGITS_TOL (1.1e-4 between two OpenBLAS kernels); not
    # measured here (AVX2: no wide sums)
    check = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=2e-4) if NativeMatmul().wide_sums else \
        np.testing.assert_array_equal
    check(stored.compute_logits(batch), pair.fused.compute_logits(batch))
    for mine, theirs in zip(stored.cache.keys, pair.fused.cache.keys, strict=True):
        check(mine, theirs)


CHUNKS_AND_DECODES = ([0, 5, 33, 200, 7], [17, 64, 1, 40, 3])


@pytest.mark.parametrize(("prefixes", "chunks"), [([0, 40, 7], [300, 1, 12]), CHUNKS_AND_DECODES,
                                                  ([3, 0, 9], [1, 2, 509])],
                         ids=["prompt beside a decode", "chunks and decodes", "512 rows"])
def test_stored_weights_take_steps_of_up_to_512_tokens(cut_model: LoadedModel, cut_stored: LoadedModel,
                                                       monkeypatch: pytest.MonkeyPatch, prefixes: list[int],
                                                       chunks: list[int]) -> None:
    """Every layer matrix as stored, the default model cut to two layers (cut()): prompts, chunks continuing
    cached prefixes and decodes in one fused call, each chunk's rows attending together (the chunk kernel), as the
    NumPy reference computes them; float32 matrices keep BLAS past 64 rows."""
    assert_stored_steps_match(cut_model, cut_stored, monkeypatch, prefixes, chunks)


def test_the_whole_default_model_takes_a_stored_step_of_chunks_and_decodes(
        model: LoadedModel, stored_model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """All its layers and its whole head, as stored."""
    assert_stored_steps_match(model, stored_model, monkeypatch, *CHUNKS_AND_DECODES)


def assert_stored_steps_match(model: LoadedModel, stored_model: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                              prefixes: list[int], chunks: list[int]) -> None:
    """model: the float32 copy of stored_model."""
    assert NumpyBackend(model, "native").forward.fused_step.max_rows == MAX_ROWS  # type: ignore[union-attr]
    pair = Pair(stored_model, 1024, 16, float32_copy=model)
    assert pair.fused.forward.fused_step.max_rows == STORED_MAX_ROWS  # type: ignore[union-attr]
    calls = pair.fused_calls(monkeypatch)
    assert_same_step(pair, pair.step_batch(prefixes, chunks))
    assert calls == [sum(chunks)]


# --- Gemma 3's layer ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """7 layers (the sixth global), window 8, 4 query heads of 32 over 1 kv head, hidden 64."""
    return load_model(write_tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf"))


def gemma3_bound(model: LoadedModel, context: int, magnitude: float) -> float:
    """forward_bound for this model's shape, `context` the longest context a global layer attends to."""
    c, layers = model.config, model.weights.layers
    gain = max(float(np.abs(layer.q_norm).max() * np.abs(layer.k_norm).max())  # type: ignore[arg-type]
               for layer in layers)
    return forward_bound(c.num_layers, c.hidden_size, c.intermediate_size, c.q_size, c.head_dim, context, gain,
                         magnitude)


def assert_step_within_bound(pair: Pair, model: LoadedModel, batch: StepBatch) -> None:
    """Logits and every layer's K/V within gemma3_bound of the NumPy forward's."""
    fused, reference = pair.fused.compute_logits(batch), pair.reference.compute_logits(batch)
    context = int(batch.context_lens.max())
    np.testing.assert_allclose(fused, reference, rtol=0, atol=gemma3_bound(model, context, np.abs(reference).max()))
    for name in ("keys", "values"):
        for mine, theirs in zip(getattr(pair.fused.cache, name), getattr(pair.reference.cache, name), strict=True):
            theirs = theirs.astype(np.float32)
            np.testing.assert_allclose(mine.astype(np.float32), theirs, rtol=0,
                                       atol=gemma3_bound(model, context, float(np.abs(theirs).max())))


GEMMA3_STEPS = [([5, 30, 0, 9, 60], [1, 1, 1, 1, 1]), ([0], [20]), ([40, 17, 0, 3], [1, 7, 20, 1]),
                ([3, 12, 7], [30, 1, 9])]
GEMMA3_IDS = ["decodes", "a prompt past the window", "mixed", "chunks across the window"]


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16"])
@pytest.mark.parametrize(("prefixes", "chunks"), GEMMA3_STEPS, ids=GEMMA3_IDS)
def test_gemma3_layers_match_the_numpy_forward(tiny_gemma3: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                               tier: CpuTier, prefixes: list[int], chunks: list[int],
                                               kv_cache_dtype: str) -> None:
    """QK norms, sandwich norms, GeGLU, RoPE over head halves at two bases, and windows of 8 that decodes and
    chunks (one starting inside a window, one spanning several) outgrow: one C call, on every tier."""
    assert NativeFusedStep.supports(tiny_gemma3.config, tiny_gemma3.weights)
    pair = Pair(tiny_gemma3, 256, 4, kv_cache_dtype=kv_cache_dtype, tier=tier)
    calls = pair.fused_calls(monkeypatch)
    batch = pair.step_batch(prefixes, chunks)
    if kv_cache_dtype == "float16":  # a K/V value near a float16 rounding tie: HALF_TOLERANCES' reasoning
        assert_same_step(pair, batch)
    else:
        assert_step_within_bound(pair, tiny_gemma3, batch)
    assert calls == [sum(chunks)]


def test_gemma3_per_layer_path_runs_the_c_windows(tiny_gemma3: LoadedModel, monkeypatch: pytest.MonkeyPatch,
                                                  tier: CpuTier) -> None:
    """Past the fused step's rows: the per-layer path, its sliding layers by the C kernels with their window."""
    pair = Pair(tiny_gemma3, 256, 4, tier=tier)
    calls = pair.fused_calls(monkeypatch)
    assert getattr(pair.fused.forward.chunk_attention, "__self__", None).__class__ is NativeAttention
    assert_step_within_bound(pair, tiny_gemma3, pair.step_batch([0, 3, 50], [70, 1, 1]))
    assert calls == []


def test_the_tiny_gemma3s_windows_matter(tiny_gemma3: LoadedModel) -> None:
    """Its logits with the window lifted move by far more than the bound: the tests above would catch a C
    window that reads too much or too little."""
    pair = Pair(tiny_gemma3, 256, 4)
    batch = pair.step_batch([40], [1])
    windowed = pair.reference.compute_logits(batch)
    files = tiny_gemma3.files
    lifted = replace(tiny_gemma3, files=replace(files, config=replace(files.config, sliding_window=0)))
    whole = NumpyBackend(lifted, "numpy")
    whole.init_cache(256, 4)
    for mine, theirs in zip((*whole.cache.keys, *whole.cache.values),
                            (*pair.fused.cache.keys, *pair.fused.cache.values), strict=True):
        mine[...] = theirs
    assert np.abs(whole.compute_logits(batch) - windowed).max() > 100 * gemma3_bound(tiny_gemma3, 41, 30.0)


@pytest.fixture(scope="module")
def gemma3(gemma3_stored: LoadedModel) -> LoadedModel:
    return gemma3_stored


def test_gemma3_270m_takes_the_fused_step(gemma3: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real model (its K-quant layers as stored): the fused step is chosen, and a step of decodes beside a
    prompt chunk past its 512-token window runs in one call, within the bound of the NumPy forward."""
    assert NativeFusedStep.supports(gemma3.config, gemma3.weights)
    pair = Pair(gemma3, 96, 16, float32_copy=dequantized(gemma3))
    calls = pair.fused_calls(monkeypatch)
    assert_step_within_bound(pair, gemma3, pair.step_batch([600, 5, 0], [1, 1, 40]))
    assert calls == [42]
