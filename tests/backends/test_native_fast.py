"""The fast precision (fast_matmul.h): on a CPU whose AMX tiles the process may use, steps of FAST_MIN_ROWS rows
or more multiply bfloat16-rounded values on the tiles, checked against NumPy's product of the same rounded values;
smaller steps on Q4_0 / Q4_1 / Q5_0 / Q5_1 and K-quant weights round x to 8 bits and multiply integers (q8_dots.h,
q8_k.h), checked against NumPy's q8_reference within q8_bound; every other step is the exact kernels', bit for
bit. The kernel tests run on every CPU tier
this host runs that has the path they check, and each tier is held to the paths it should have."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import LoadedModel, load_model
from backends.model.quant import QuantMatrix
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.matmul import (
    NativeMatmul,
    fast_reference,
    q8_bound,
    q8_reference,
    q8_rows,
    small_step_parts,
    to_bfloat16,
)
from backends.numpy_backend.native.weights import (
    LANE_STEP_TYPES,
    SMALL_STEP_TYPES,
    STORED_TYPES,
    TILED_SMALL_STEP_TYPES,
)
from tests.backends.bounds import assert_within
from tests.backends.test_native_quant import K_QUANTS, random_blocks
from tests.backends.tiers import HOST, LANE_STEPS, RUNNABLE, SMALL_STEPS, TILES, WIDE_STEPS
from tests.required import hardware_absent

SMALL_STEP_ERROR = 0.032  # the 8-bit path's logits, as a share of the largest: measured 1.6 %, bound 2x

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
FAST_MIN_ROWS = 4  # fast_matmul.h
FAST_TILE = 16  # fast_matmul.h: on amx, fewer rows on Q4_0 / Q4_1 / Q8_0 take the 8-bit path rather than the tiles
Q8_MAX_ROWS = 64  # fast_matmul.h: the most rows the 8-bit path takes on the AVX-512 tiers
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16)
Test = TypeVar("Test", bound=Callable[..., None])


def on_tiers(names: frozenset[str], absent: str) -> pytest.MarkDecorator:
    """Runs the test on each tier this host runs among `names` (in place of every tier); none: a skip, `absent`
    saying why (the machine lacks the hardware, and CI's may too)."""
    tiers = [tier for tier in RUNNABLE if tier.name in names]
    return pytest.mark.parametrize("tier", tiers or [absent], ids=lambda t: getattr(t, "name", "absent"))


@pytest.fixture
def fast(matmul_for: Callable[[CpuTier, bool], NativeMatmul], tier: CpuTier | str) -> NativeMatmul:
    if isinstance(tier, str):
        hardware_absent(tier)
    return matmul_for(tier, True)


@pytest.fixture
def exact(matmul_for: Callable[[CpuTier, bool], NativeMatmul], fast: NativeMatmul) -> NativeMatmul:
    return matmul_for(fast.tier, False)


@pytest.fixture
def tiles(fast: NativeMatmul) -> None:
    """A skip where the process may not use AMX tiles: the OS did not allow it."""
    if not fast.fast_uses_tiles:
        hardware_absent("this process may not use the AMX tiles")


def needs_tiles(test: Test) -> Test:
    """On the amx tier, where this process may use the tiles."""
    return on_tiers(TILES, "no AMX tiles on this machine")(pytest.mark.usefixtures("tiles")(test))


@pytest.fixture(scope="module")
def host_tiles(kernel_cache: Path) -> None:
    """For the tests through the backend, which runs the host's own tier: a skip without AMX tiles."""
    if not NativeMatmul(cache_dir=kernel_cache, fast=True).fast_uses_tiles:
        hardware_absent("no AMX tiles on this machine")


def test_the_tier_runs_the_fast_paths_it_should(fast: NativeMatmul, exact: NativeMatmul) -> None:
    """8-bit small steps exactly on the tiers that have them, tiles only on the amx tier; where a tier lacks the
    small steps, the fast precision's small steps are the exact ones', bit for bit."""
    assert fast.fast_small_steps == (fast.tier.name in SMALL_STEPS)
    assert fast.fast_lane_steps == (fast.tier.name in LANE_STEPS)
    assert not fast.fast_uses_tiles or fast.tier.name in TILES
    if not fast.fast_small_steps:
        w, x = stored(Q.Q4_1, 40, 576), activations(2, 576)
        np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


def stored(qtype: Q, rows: int, cols: int, seed: int = 0) -> QuantMatrix:
    """gguf's quantization of normal values; the K-quants (which gguf cannot quantize) test_native_quant's random
    super-blocks."""
    if qtype in K_QUANTS:
        return random_blocks(qtype, rows, cols, seed)
    return QuantMatrix.quantize(np.random.default_rng(seed).normal(0, 0.3, (rows, cols)).astype(np.float32), qtype)


def small_width(qtype: Q, cols: int) -> int:
    """cols for the small-step tests: in whole super-blocks of 256 for the K-quants (576 -> 768)."""
    return -(-cols // 256) * 256 if qtype in K_QUANTS else cols


def activations(rows: int, cols: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def eight_bit_before_tiles(qtype: Q, rows: int) -> bool:
    """On amx, whether the 8-bit path takes a step the tiles could (fast_matmul.h's q8_before_tiles)."""
    return qtype in TILED_SMALL_STEP_TYPES and (rows < FAST_TILE or (qtype == Q.Q8_0 and rows <= 2 * FAST_TILE))


def test_bfloat16_rounding_is_to_nearest_even() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, -3.0, 0.0, 65504.0, 1.0000001], np.float32)
    expected = np.array([1.0, 1.0, 1.015625, -3.0, 0.0, 65536.0, 1.0], np.float32)  # ties go to the even one
    np.testing.assert_array_equal(to_bfloat16(values), expected)


SHAPES = [(t, inner, outputs) for t in TYPES for inner, outputs in ((64, 13), (576, 960), (1536, 577))] + [
    (t, 40, 19) for t in (Q.F16, Q.BF16)]  # widths past whole tiles of 32, where the format allows them


@needs_tiles
@pytest.mark.parametrize(("qtype", "inner", "outputs"), SHAPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [FAST_MIN_ROWS, 5, 16, 17, 33, 64, 130])
def test_tiles_multiply_the_rounded_values(fast: NativeMatmul, qtype: Q, inner: int, outputs: int, rows: int) -> None:
    """Every type; rows and weight rows past whole tiles of 16 (zero padding). Fewer rows than a tile on Q4_0,
    Q4_1 and Q8_0, and up to two tiles on Q8_0 (q8_lanes.h), take the 8-bit path instead (faster there), within
    its bound."""
    w, x = stored(qtype, outputs, inner, seed=inner + outputs), activations(rows, inner, seed=rows)
    if eight_bit_before_tiles(qtype, rows):
        before = fast.small_steps_run()
        assert_within(fast.project(x, w), q8_reference(x, w), q8_bound(x, w))
        assert fast.small_steps_run() == before + 1
        return
    reference = fast_reference(x, w).astype(np.float64)
    scale = np.abs(to_bfloat16(x)).astype(np.float64) @ np.abs(to_bfloat16(w.dequantize())).T.astype(np.float64)
    out = fast.project(x, w)
    assert out.shape == (rows, outputs) and out.dtype == np.float32
    assert np.all(np.abs(out - reference) <= 1e-6 * scale + 1e-7)  # float32 sums of exact products


@needs_tiles
def test_a_rows_result_does_not_depend_on_its_tile_or_lane(fast: NativeMatmul) -> None:
    w, x = stored(Q.Q4_1, 45, 576), activations(40, 576)
    together = fast.project(x, w)
    np.testing.assert_array_equal(fast.project(x[20:36], w), together[20:36])
    np.testing.assert_array_equal(fast.project(np.concatenate([x[7:15], x[30:40]]), w),
                                  together[[*range(7, 15), *range(30, 40)]])


needs_small_steps = on_tiers(SMALL_STEPS, "no AVX2 or NEON dot products on this machine")


@pytest.fixture(scope="module")
def host_small_steps() -> None:
    """For the tests through the backend, which runs the host's own tier: a skip where it has no 8-bit path."""
    if HOST.choose().name not in SMALL_STEPS:
        hardware_absent("no AVX2 or NEON dot products on this machine")
SMALL_TYPES = tuple(sorted(SMALL_STEP_TYPES))  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
SMALL_SHAPES = [(t, inner, outputs) for t in SMALL_TYPES
                for inner, outputs in (((256, 3), (512, 13), (768, 960), (1536, 577)) if t in K_QUANTS
                                       else ((32, 3), (64, 13), (576, 960), (1536, 577)))]


def test_x_is_rounded_per_block_of_32_to_nearest_even() -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]  # the first block's scale is 1: halves go to the even integer
    x[0, 32:34] = [-63.5, 0.25]  # the second block's: 63.5 / 127 = 0.5, so -63.5 -> -127 and 0.25 -> 0 (0.5)
    q, scale = q8_rows(x)
    assert scale.tolist() == [[1.0, 0.5]]
    assert q[0, 0, :4].tolist() == [127, 0, 2, -2] and q[0, 1, :2].tolist() == [-127, 0]
    assert not q[0, 0, 4:].any() and not q[0, 1, 2:].any()


@needs_small_steps
@pytest.mark.parametrize(("qtype", "inner", "outputs"), SMALL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [1, 2, FAST_MIN_ROWS - 1])
def test_small_steps_multiply_8_bit_x_in_integers(fast: NativeMatmul, qtype: Q, inner: int, outputs: int,
                                                 rows: int) -> None:
    """Every 8-bit path's type; widths of one block and more, weight rows past whole groups of 8, every row
    count below the tiles': x rounded as q8_rows rounds it, integer dot products, float32 scaling and sums,
    within q8_bound (the float32 roundings of the scaling and of the chain of blocks: (k / 32 + 4) U of the
    terms' sizes) of the float64 reference; and the 8-bit path ran, once per call."""
    w, x = stored(qtype, outputs, inner, seed=inner + outputs), activations(rows, inner, seed=rows)
    x[0, :32] = 0.0  # an all-zero block: scale 0, no division by it
    before = fast.small_steps_run()
    out = fast.project(x, w)
    assert fast.small_steps_run() == before + 1
    assert out.shape == (rows, outputs) and out.dtype == np.float32
    assert_within(out, q8_reference(x, w), q8_bound(x, w))


@pytest.mark.parametrize("qtype", SMALL_TYPES, ids=lambda t: t.name)
def test_the_small_steps_integers_are_ggufs_weights(qtype: Q) -> None:
    """q8_reference's reading of the blocks: scale * q + offset is gguf's dequantized weight (the product exact,
    or for Q6_K rounded once as gguf's, so the float64 value rounded to float32 is gguf's float32 one, bit for
    bit); every integer the format holds occurs."""
    w = stored(qtype, 13, small_width(qtype, 576))
    q, d, offset = small_step_parts(w)
    low, high = {Q.Q5_0: (0, 31), Q.Q5_1: (0, 31), Q.Q5_K: (0, 31), Q.Q6_K: (-32, 31), Q.Q2_K: (0, 3),
                 Q.Q3_K: (-4, 3), Q.Q8_0: (-127, 127)}.get(qtype, (0, 15))
    assert q.min() == low and q.max() == high
    weights = (np.repeat(d, 16, axis=2) * q + np.repeat(offset, 16, axis=2)).astype(np.float32).reshape(w.shape)
    np.testing.assert_array_equal(weights, w.dequantize())


@pytest.mark.parametrize("qtype", SMALL_TYPES, ids=lambda t: t.name)
def test_the_small_steps_run_where_the_tier_has_them(fast: NativeMatmul, exact: NativeMatmul, qtype: Q) -> None:
    """Counted by the library: each call of 1-3 rows runs the 8-bit path once on the tiers that have it, never
    on the others (nor in the exact precision, nor for more than 64 rows)."""
    w = stored(qtype, 40, small_width(qtype, 576))
    before = fast.small_steps_run()
    for rows in (1, 2, FAST_MIN_ROWS - 1, Q8_MAX_ROWS + 1):
        fast.project(activations(rows, w.shape[1]), w)
        exact.project(activations(rows, w.shape[1]), w)
    assert fast.small_steps_run() - before == (3 if fast.tier.name in SMALL_STEPS else 0)


needs_wide_steps = on_tiers(WIDE_STEPS, "no AVX-512 on this machine")
# two whole groups of 8 weight rows and part of a third; widths of two blocks (32, or 256 for the K-quants) and more
WIDE_SHAPES = [(t, 512 if t in K_QUANTS else 608, 21) for t in SMALL_TYPES]


@needs_wide_steps
@pytest.mark.parametrize(("qtype", "inner", "outputs"), WIDE_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [FAST_MIN_ROWS, 7, 8, 20, 33, Q8_MAX_ROWS])
def test_steps_of_up_to_64_rows_multiply_8_bit_x_on_the_avx512_tiers(fast: NativeMatmul, qtype: Q, inner: int,
                                                                     outputs: int, rows: int) -> None:
    """Past the small steps, six rows of x at a time (Q8_0 from 8 rows: 16 at a time in lanes, q8_lanes.h, the
    last 16 part empty): within q8_bound of q8_reference, the 8-bit path run once, and each row's floats the ones
    it gets alone (its sums never meet another row's; alone, a row takes the small step's path). On amx, Q4_0 and
    Q4_1 go to the tiles instead from 16 rows, Q8_0 from 33 (test_tiles_multiply_the_rounded_values)."""
    w, x = stored(qtype, outputs, inner, seed=inner + outputs), activations(rows, inner, seed=rows)
    before = fast.small_steps_run()
    out = fast.project(x, w)
    if fast.fast_uses_tiles and qtype in TILED_SMALL_STEP_TYPES and not eight_bit_before_tiles(qtype, rows):
        assert fast.small_steps_run() == before
        return
    assert fast.small_steps_run() == before + 1
    assert_within(out, q8_reference(x, w), q8_bound(x, w))
    for i in (0, rows - 1):
        np.testing.assert_array_equal(out[i : i + 1], fast.project(x[i : i + 1], w))


needs_lane_steps = on_tiers(LANE_STEPS, "no AVX-512 VNNI on this machine")
LANE_SHAPES = [(t, 512 if t in K_QUANTS else 608, 21) for t in sorted(LANE_STEP_TYPES)]


@needs_lane_steps
@pytest.mark.parametrize(("qtype", "inner", "outputs"), LANE_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [Q8_MAX_ROWS + 1, 130])
def test_a_prompts_chunk_multiplies_8_bit_x_in_lanes_on_the_vnni_tiers(kernel_cache: Path, fast: NativeMatmul,
                                                                       qtype: Q, inner: int, outputs: int,
                                                                       rows: int) -> None:
    """Past 64 rows (a prompt's chunk in the fused step), the lanes' types stay on the 8-bit path with x in
    lanes, 16 rows at a time (q8_lanes.h: a K-quant super-block decoded once for all of them): within q8_bound
    of q8_reference, and each row's floats the ones it gets alone. On amx, Q4_0, Q4_1 and Q8_0 go to the tiles
    (test_tiles_multiply_the_rounded_values)."""
    wide = NativeMatmul(max_rows=256, cache_dir=kernel_cache, fast=True, tier=fast.tier)
    assert wide.fast_lane_steps
    w, x = stored(qtype, outputs, inner, seed=inner + outputs), activations(rows, inner, seed=rows)
    before = wide.small_steps_run()
    out = wide.project(x, w)
    if wide.fast_uses_tiles and qtype in TILED_SMALL_STEP_TYPES:
        assert wide.small_steps_run() == before
        return
    assert wide.small_steps_run() == before + 1
    assert_within(out, q8_reference(x, w), q8_bound(x, w))
    for i in (0, 77, rows - 1):
        np.testing.assert_array_equal(out[i : i + 1], wide.project(x[i : i + 1], w))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_0], ids=lambda t: t.name)
def test_steps_of_4_rows_or_more_are_exact_below_avx512(fast: NativeMatmul, exact: NativeMatmul, qtype: Q) -> None:
    """Three rows of x at a time lost to the exact strips (fast_matmul.h): there, and on every tier past 64 rows,
    the fast precision's steps on the 8-bit path's types that no tile reads are the exact ones, bit for bit."""
    w = stored(qtype, 40, small_width(qtype, 576))
    for rows in ((FAST_MIN_ROWS, 16, Q8_MAX_ROWS + 1) if fast.tier.name not in WIDE_STEPS else (Q8_MAX_ROWS + 1,)):
        x = activations(rows, w.shape[1])
        np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


@needs_small_steps
def test_small_steps_cost_what_rounding_x_costs(fast: NativeMatmul, exact: NativeMatmul) -> None:
    """Against the exact kernels, 8-bit x moves a dot product by about 1 / 254 of a block's largest value
    per value: within 1 % of the sum of the products' sizes, and far from 0 (the rounding ran)."""
    w, x = stored(Q.Q4_1, 96, 576), activations(1, 576)
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    error = np.abs(fast.project(x, w) - exact.project(x, w)) / scale
    assert error.max() < 0.01 and error.mean() > 1e-5


@needs_small_steps
def test_a_small_steps_rows_do_not_depend_on_each_other(fast: NativeMatmul) -> None:
    w, x = stored(Q.Q4_0, 45, 576), activations(3, 576)
    together = fast.project(x, w)
    for i in range(3):
        np.testing.assert_array_equal(fast.project(x[i : i + 1], w), together[i : i + 1])


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16])
@pytest.mark.parametrize("rows", [1, 2, FAST_MIN_ROWS - 1])
def test_small_steps_on_other_weights_are_exact(fast: NativeMatmul, exact: NativeMatmul, qtype: Q,
                                                rows: int) -> None:
    w, x = stored(qtype, 77, 576), activations(rows, 576)
    np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


def test_without_tiles_large_steps_are_exact(fast: NativeMatmul, exact: NativeMatmul) -> None:
    if fast.fast_uses_tiles:
        assert fast.fast
        hardware_absent("this machine has the tiles; the check needs a CPU without them")
    assert fast.fast == fast.fast_small_steps
    w, x = stored(Q.F16, 30, 64), activations(16, 64)  # no 8-bit path reads F16
    np.testing.assert_array_equal(fast.project(x, w), exact.project(x, w))


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(stored=STORED_TYPES)


@pytest.mark.usefixtures("host_tiles")
def test_the_fused_step_in_the_fast_precision(model: LoadedModel) -> None:
    """A step of 8 prompts of 5 tokens (40 rows: the tiles) through the default model: the logits stay within
    bfloat16's reach of the exact ones, and each row's greedy token is the exact one's or a near tie with it."""
    backends = [NumpyBackend(model, "native", precision) for precision in ("exact", "fast")]
    logits = []
    for backend in backends:
        backend.init_cache(64, 16)
        seqs = [SeqState(blocks=[2 * i, 2 * i + 1]) for i in range(8)]
        chunks = [[200 + 37 * i + j for j in range(5)] for i in range(8)]
        logits.append(backend.compute_logits(make_batch(seqs, chunks, 16)))
    exact_logits, fast_logits = logits
    assert not np.array_equal(exact_logits, fast_logits)  # the tiles ran
    # measured about 1.7 % on an AMX machine (the 5 % here before was ~3x it), 0.7 % (0.22 of 32) where NumPy
    # rounds every projection of 4+ rows as the tiles do (fast_reference); bound 2x the AMX figure
    tolerance = 0.035 * np.abs(exact_logits).max()
    assert np.abs(fast_logits - exact_logits).max() < tolerance
    chosen = exact_logits[np.arange(8), fast_logits.argmax(1)]
    assert np.all(chosen >= exact_logits.max(1) - tolerance)  # a flipped token is a near tie, within the error
    # 6 of 8 rows (the NumPy rounding keeps all 8): the check above bounds the rows that flip
    assert np.mean(fast_logits.argmax(1) == exact_logits.argmax(1)) >= 0.75


@pytest.mark.usefixtures("host_tiles")
def test_greedy_decoding_in_the_fast_precision_follows_the_exact_one(model: LoadedModel) -> None:
    """8 chat prompts decoded together (steps of 8 rows: the 8-bit path on the Q4_1 layers and the Q8_0 head)
    for 12 tokens: most continuations agree
    token for token with the exact precision's (a projection that read stale values past its own width once
    made every one of them differ from the second token on)."""
    from bench.precision import agreement, greedy, prompts  # noqa: PLC0415 - the benchmark's own helpers

    ids = prompts(model, 8)
    outs = [greedy(NumpyBackend(model, "native", precision), model, ids, 12) for precision in ("exact", "fast")]
    matched = agreement(*outs, 12).matched
    assert sorted(matched)[len(matched) // 2] >= 6 and max(matched) == 12, matched


def test_every_tier_gives_the_small_steps_the_same_floats(matmul_for: Callable[[CpuTier, bool], NativeMatmul]
                                                          ) -> None:
    """AVX2's pmaddubsw + pmaddwd, VNNI's vpdpbusd and NEON's sdot make the same int32 sums, scaled alike: the
    same floats, bit for bit, on every tier with the 8-bit path (so the greedy checks below hold on each)."""
    tiers = [tier for tier in RUNNABLE if tier.name in SMALL_STEPS]
    if len(tiers) < 2:
        hardware_absent("fewer than two tiers with 8-bit small steps run on this machine")
    first, *others = (matmul_for(tier, True) for tier in tiers)
    for qtype in SMALL_TYPES:
        w = stored(qtype, 37, small_width(qtype, 576), seed=int(qtype))
        for rows in (1, 2, 3):
            x = activations(rows, w.shape[1], seed=rows)
            for other in others:
                np.testing.assert_array_equal(other.project(x, w), first.project(x, w))


def decode_after_prompts(model: LoadedModel, precision: str, count: int) -> np.ndarray:
    """The logits of one decode step of `count` sequences, each after a 5-token prompt of its own."""
    backend = NumpyBackend(model, "native", precision)
    backend.init_cache(8 * count, 16)
    seqs = [SeqState(blocks=[2 * i, 2 * i + 1]) for i in range(count)]
    backend.compute_logits(make_batch(seqs, [[200 + 7 * i + j for j in range(5)] for i in range(count)], 16))
    seqs = [SeqState(blocks=s.blocks, tokens=[0] * 5) for s in seqs]
    return backend.compute_logits(make_batch(seqs, [[205 + i] for i in range(count)], 16))


@pytest.mark.usefixtures("host_small_steps")
def test_decode_steps_of_one_to_three_rows_run_on_8_bit_x(model: LoadedModel) -> None:
    """Decode steps of one and of three rows through the default model (the 8-bit path in every layer's
    projections, those that add into the residual too): their logits differ from the exact ones (the path ran)
    by little; and three chat prompts, each decoded alone for 12 tokens, mostly follow the exact precision's
    greedy tokens."""
    from bench.precision import agreement, greedy_alone, prompts  # noqa: PLC0415 - the benchmark's own helpers

    for count in (1, 3):  # one row, and three (the most the 8-bit path takes)
        exact_logits, fast_logits = (decode_after_prompts(model, precision, count) for precision in ("exact", "fast"))
        assert not np.array_equal(exact_logits, fast_logits)
        # measured 1.6 % (0.45 of 28, one row and three): the same on every CPU, as every tier's 8-bit path gives
        # the same floats (test_every_tier_gives_the_small_steps_the_same_floats); bound 2x
        assert np.abs(fast_logits - exact_logits).max() < SMALL_STEP_ERROR * np.abs(exact_logits).max()
    ids = prompts(model, 3)
    outs = [greedy_alone(NumpyBackend(model, "native", p), model, ids, 12) for p in ("exact", "fast")]
    matched = agreement(*outs, 12).matched
    assert max(matched) == 12, matched
    # How many tokens agree depends on the CPU (the exact precision's floats are its own: 12, 4 and 1 on an AVX2
    # host, more on AMX): what holds on every one is that the fast precision leaves the exact one's greedy path
    # only where the exact logits are within twice its error of a tie.
    for prompt, exact, fast, at in zip(ids, *outs, matched, strict=True):
        if at < 12:
            logits = exact_logits_after(model, [*prompt, *exact[:at]])
            gap = logits[exact[at]] - logits[fast[at]]
            assert -1e-3 <= gap <= 2 * SMALL_STEP_ERROR * np.abs(logits).max(), (at, gap)


def exact_logits_after(model: LoadedModel, ids: list[int]) -> np.ndarray:
    """The exact precision's logits for the token after `ids`."""
    backend = NumpyBackend(model, "native", "exact")
    blocks = -(-len(ids) // 16)
    backend.init_cache(blocks, 16)
    return backend.compute_logits(make_batch([SeqState(blocks=list(range(blocks)))], [ids], 16))[0]
