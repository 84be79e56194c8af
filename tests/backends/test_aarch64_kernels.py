"""The C kernels built for AArch64, both of its tiers (generic: -march=armv8-a, NEON through the kernels' plain
paths; neon: armv8.2-a with the dot product extension and float16), run under qemu-user (aarch64/cross.py)
against the x86 kernel tests' cases, NumPy references and bounds: the projections on every weight type, exact and
fast, the dequantization (with every float16 scale of each quantized type), decode and prefill-chunk attention
over float32 and float16 caches, half.h's conversions, and the sampler's draws. Each family of cases runs in one
start of the emulator.

The emulator does about 10^8 multiply-adds a second, so the projections' large shapes run up to 5 rows of x
(tiles of 1-2 rows, a register block and a partial one), the small ones up to 64 as on x86 (every path: several
register blocks, tail rows); each case's inputs and reference are built once for both tiers (functools.cache).
Where the host runs the avx2 tier, the AArch64 builds' projections are also compared with it, bit for bit: the
same FMAs summed in the same order, and for the small steps the same rounding of x."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from backends.model.quant import Matrix, QuantMatrix
from backends.numpy_backend.attention import decode_attention, prefill_attention
from backends.numpy_backend.native.cpu_tiers import X86, CpuTier, find
from backends.numpy_backend.native.matmul import MAX_ROWS, NativeMatmul, q8_bound, q8_reference
from backends.numpy_backend.native.weights import EIGHT_LANES_ONLY
from tests.backends import test_native_fast as fast_cases
from tests.backends import test_native_quant as quant_cases
from tests.backends import test_native_sampling as sampling_cases
from tests.backends.aarch64 import cross
from tests.backends.aarch64.cross import (
    ARM_TIERS,
    Batch,
    Build,
    Call,
    Kernels,
    Tools,
    build_all,
    find_tools,
    require_tools,
)
from tests.backends.bounds import assert_within, attention_bound, dot_bound
from tests.backends.test_kv_float16 import awkward_floats, half_cache
from tests.backends.test_native_attention import paged_problem
from tests.backends.test_native_matmul import problem
from tests.background import background_of

TIERS = tuple(ARM_TIERS)  # generic, neon
Key = tuple[object, ...]
Calls = dict[Key, Call]
ALL_TYPES = (*quant_cases.QUANTIZED, *quant_cases.FLOATS)
LARGE = ((576, 960), (768, 960), (1536, 577))  # (inner, outputs) of the x86 tests' shapes run up to 5 rows here
SMALL_STEP_ROWS = (1, 2, 3)  # fewer than fast_matmul.h's FAST_MIN_ROWS: q8_dots.h's steps


def rows_for(inner: int, outputs: int, rows: Iterable[int]) -> list[int]:
    return [r for r in rows if r <= 5 or (inner, outputs) not in LARGE]


RUNS = "aarch64-kernel-runs"
Make = Callable[[Kernels, Batch], Iterable[tuple[Key, Call]]]


def run_batch(kernels: Kernels, directory: Path, make: Make) -> Calls:
    """The calls `make` queues, by key, after one run of the emulator for all of them."""
    directory.mkdir()
    batch = kernels.batch(directory)
    calls = dict(make(kernels, batch))
    batch.run()
    return calls


def run_every_batch(tools: Tools, root: Path) -> dict[str, Calls]:
    """Every family of cases (BATCHES), each in one run of the emulator, after the builds."""
    kernels = build_all(tools)
    return {name: run_batch(kernels, root / name, make) for name, make in BATCHES.items()}


def start_in_background(session: pytest.Session) -> None:
    """Called when collection ends with tests of this module selected (tests/background.py): the emulator's runs
    overlap the rest of the suite, and these tests, which read them, run last."""
    tools = find_tools()
    if tools is not None:
        background = background_of(session)
        background.start(RUNS, run_every_batch, tools, background.directory(RUNS))


@pytest.fixture(scope="module")
def aarch64_runs(request: pytest.FixtureRequest) -> dict[str, Calls]:
    tools = require_tools()  # CI: a failure; elsewhere: a skip with the reason
    background = background_of(request.session)
    runs: dict[str, Calls] = background.take(RUNS, run_every_batch, tools, background.directory(RUNS))
    return runs


# --- the tools ---------------------------------------------------------------------------------------------------


def without(missing: str) -> Callable[[str], str | None]:
    return lambda name: None if name == missing else f"/usr/bin/{name}"


def test_a_missing_emulator_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cross.shutil, "which", without(cross.QEMU))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="qemu-aarch64 not on PATH"):
        require_tools()


def test_a_missing_cross_compiler_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cross.shutil, "which", without(cross.CROSS_CC))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="aarch64-linux-gnu-gcc not on PATH.*make cross-tools"):
        require_tools()


# --- what each build runs -----------------------------------------------------------------------------------------


def probe_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    return (((tier,), batch.probe(kernels.builds[tier])) for tier in TIERS)


@pytest.fixture(scope="module")
def probes(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["probes"]


@pytest.mark.parametrize(("tier", "small_steps"), [("generic", 0), ("neon", 1)])
def test_each_tier_reports_its_paths(probes: Calls, tier: str, small_steps: int) -> None:
    """fast_small_steps, fast_uses_tiles, quant_sums_wide, built_with_openmp: the 8-bit small steps on the neon
    tier only (the dot product extension), never AMX tiles nor 16-lane sums, and OpenMP threads."""
    assert probes[tier,].result().tolist() == [small_steps, 0, 0, 1]


# --- float32 weights (test_native_matmul) -------------------------------------------------------------------------

FLOAT32_CASES = [(rows, inner, outputs) for inner, outputs in [(8, 8), (64, 13), (576, 960), (1536, 577), (16, 3)]
                 for rows in rows_for(inner, outputs, [1, 2, 3, 4, 5, 7, 10, MAX_ROWS])]
INDEPENDENT_SHAPES = [(64, 40), (16, 13), (576, 577), (8, 3)]


def float32_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier, (rows, inner, outputs) in product(TIERS, FLOAT32_CASES):
        yield (tier, rows, inner, outputs), batch.matmul(kernels.builds[tier], *float32_case(rows, inner, outputs))
    for tier, (inner, outputs) in product(TIERS, INDEPENDENT_SHAPES):
        x, w = problem(11, inner, outputs)
        for rows in range(1, 12):
            yield (tier, "batch", rows, inner, outputs), batch.matmul(kernels.builds[tier], x[:rows], w)
            yield (tier, "alone", rows, inner, outputs), batch.matmul(kernels.builds[tier], x[rows - 1 : rows], w)


@pytest.fixture(scope="module")
def float32_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["float32"]


@cache
def float32_case(rows: int, inner: int, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    return problem(rows, inner, outputs, seed=rows * inner + outputs)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("rows", "inner", "outputs"), FLOAT32_CASES)
def test_float32_weights_match_numpy(float32_runs: Calls, tier: str, rows: int, inner: int, outputs: int) -> None:
    x, w = float32_case(rows, inner, outputs)
    out = float32_runs[tier, rows, inner, outputs].result()
    # test_native_matmul.test_matches_numpy's bound
    assert_within(out, x.astype(np.float64) @ w.T.astype(np.float64), dot_bound(x, w))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("inner", "outputs"), INDEPENDENT_SHAPES)
def test_float32_rows_are_independent(float32_runs: Calls, tier: str, inner: int, outputs: int) -> None:
    """A row's result does not depend on the rest of its batch, bit for bit (tiles, register blocks, tails)."""
    alone = np.concatenate([float32_runs[tier, "alone", rows, inner, outputs].result() for rows in range(1, 12)])
    for rows in range(2, 12):
        np.testing.assert_array_equal(float32_runs[tier, "batch", rows, inner, outputs].result(), alone[:rows])


# --- weights as stored (test_native_quant) ------------------------------------------------------------------------

STORED_CASES = [(qtype, inner, outputs, rows) for qtype in ALL_TYPES for inner, outputs in quant_cases.shapes_for(qtype)
                for rows in rows_for(inner, outputs, [1, 2, 3, 5, 17, MAX_ROWS])]
PAST_BLOCKS = [(qtype, inner, rows) for qtype in quant_cases.FLOATS for inner in (8, 40, 72, 584) for rows in (1, 2, 4)]


@cache
def stored_weights(qtype: Q, outputs: int, inner: int, seed: int) -> tuple[QuantMatrix, np.ndarray]:
    """test_native_quant's matrix, and gguf's float32 values of it."""
    w = quant_cases.stored(qtype, outputs, inner, seed=seed)
    return w, w.dequantize()


def wide(qtype: Q) -> int:
    """576, or whole super-blocks (768) for the K-quants: test_native_quant's width for the dequantization."""
    return quant_cases.width(qtype, 576)


def narrow(qtype: Q) -> int:
    return quant_cases.width(qtype, 64)


@cache
def every_half_scale(qtype: Q) -> QuantMatrix:
    return quant_cases.every_half_scale(qtype)


@cache
def stored_case(qtype: Q, inner: int, outputs: int, rows: int) -> tuple[np.ndarray, QuantMatrix, np.ndarray]:
    return quant_cases.activations(rows, inner, seed=rows), *stored_weights(qtype, outputs, inner, inner + outputs)


@cache
def every_16_bit_value(qtype: Q) -> QuantMatrix:
    """Every finite value of the type, as rows of 64 (test_native_quant's test_every_16_bit_pattern_...)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16).astype(np.float32) if qtype == Q.F16 else (
        bits.astype(np.uint32) << 16).view(np.float32)
    finite = bits[np.isfinite(values)]
    data = finite[: len(finite) // 64 * 64].view(np.uint8).reshape(-1, 128)
    return QuantMatrix(qtype, (len(data), 64), np.ascontiguousarray(data))


def stored_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier in TIERS:
        build = kernels.builds[tier]
        for case in STORED_CASES:
            x, w, dense = stored_case(*case)
            yield (tier, "stored", *case), batch.matmul(build, x, w)
            yield (tier, "copy", *case), batch.matmul(build, x, dense)
        for qtype, inner, rows in PAST_BLOCKS:
            (w, dense), x = stored_weights(qtype, 19, inner, inner), quant_cases.activations(rows, inner)
            yield (tier, "stored", qtype, inner, rows), batch.matmul(build, x, w)
            yield (tier, "copy", qtype, inner, rows), batch.matmul(build, x, dense)
        for qtype in ALL_TYPES:
            yield (tier, "dequantize", qtype), batch.dequantize(build, stored_weights(qtype, 77, wide(qtype), 0)[0])
            w, x = stored_weights(qtype, 577, narrow(qtype), 0)[0], quant_cases.activations(11, narrow(qtype))
            for rows in range(1, 12):
                yield (tier, "batch", qtype, rows), batch.matmul(build, x[:rows], w)
                yield (tier, "alone", qtype, rows), batch.matmul(build, x[rows - 1 : rows], w)
        for qtype in quant_cases.FLOATS:
            yield (tier, "every value", qtype), batch.dequantize(build, every_16_bit_value(qtype))
        for qtype in quant_cases.QUANTIZED:
            yield (tier, "every scale", qtype), batch.dequantize(build, every_half_scale(qtype))


@pytest.fixture(scope="module")
def stored_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["stored"]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("qtype", "inner", "outputs", "rows"), STORED_CASES)
def test_stored_weights_give_the_float32_copys_results(stored_runs: Calls, tier: str, qtype: Q, inner: int,
                                                       outputs: int, rows: int) -> None:
    """Bit for bit (AArch64 sums in 8 lanes), and within test_native_quant's bound of NumPy in float64."""
    out = stored_runs[tier, "stored", qtype, inner, outputs, rows].result()
    np.testing.assert_array_equal(out, stored_runs[tier, "copy", qtype, inner, outputs, rows].result())
    assert_within(out, *stored_reference(qtype, inner, outputs, rows))


@cache
def stored_reference(qtype: Q, inner: int, outputs: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's product in float64 on gguf's values, and test_native_quant's bound of its float32 error."""
    x, _, dense = stored_case(qtype, inner, outputs, rows)
    return x.astype(np.float64) @ dense.T.astype(np.float64), dot_bound(x, dense)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("qtype", "inner", "rows"), PAST_BLOCKS)
def test_float16_types_past_whole_blocks(stored_runs: Calls, tier: str, qtype: Q, inner: int, rows: int) -> None:
    np.testing.assert_array_equal(stored_runs[tier, "stored", qtype, inner, rows].result(),
                                  stored_runs[tier, "copy", qtype, inner, rows].result())


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(stored_runs: Calls, tier: str, qtype: Q) -> None:
    np.testing.assert_array_equal(stored_runs[tier, "dequantize", qtype].result(),
                                  stored_weights(qtype, 77, wide(qtype), 0)[1])


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", quant_cases.QUANTIZED, ids=lambda t: t.name)
def test_every_half_scale_dequantizes_as_gguf(stored_runs: Calls, tier: str, qtype: Q) -> None:
    """test_native_quant's: every finite float16 d (and m, dmin), gguf's values bit for bit."""
    np.testing.assert_array_equal(stored_runs[tier, "every scale", qtype].result(),
                                  every_half_scale(qtype).dequantize())


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", quant_cases.FLOATS, ids=lambda t: t.name)
def test_every_16_bit_pattern_converts_exactly(stored_runs: Calls, tier: str, qtype: Q) -> None:
    w = every_16_bit_value(qtype)
    np.testing.assert_array_equal(stored_runs[tier, "every value", qtype].result(), w.dequantize())


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_stored_rows_are_independent(stored_runs: Calls, tier: str, qtype: Q) -> None:
    alone = np.concatenate([stored_runs[tier, "alone", qtype, rows].result() for rows in range(1, 12)])
    for rows in range(2, 12):
        np.testing.assert_array_equal(stored_runs[tier, "batch", qtype, rows].result(), alone[:rows])


# --- the fast precision (test_native_fast) ------------------------------------------------------------------------


@cache
def small_step_case(qtype: Q, inner: int, outputs: int, rows: int) -> tuple[np.ndarray, QuantMatrix]:
    x = fast_cases.activations(rows, inner, seed=rows)
    w = fast_cases.stored(qtype, outputs, inner, seed=inner + outputs)
    x[0, :32] = 0.0  # an all-zero block: scale 0, no division by it
    return x, w


SMALL_CASES = [(qtype, inner, outputs, rows) for qtype, inner, outputs in fast_cases.SMALL_SHAPES
               for rows in SMALL_STEP_ROWS]
# small steps on the types q8_dots.h does not take, and steps of 4 rows and more (no AMX tiles on AArch64)
EXACT_IN_FAST = [*product((Q.F16, Q.BF16), SMALL_STEP_ROWS), (Q.Q8_0, 16), (Q.Q4_1, 16), (Q.Q5_0, 16),
                 (Q.Q2_K, 16), (Q.Q3_K, 16), (Q.Q4_K, 16), (Q.Q6_K, 16)]


@cache
def exact_in_fast_case(qtype: Q, rows: int) -> tuple[QuantMatrix, np.ndarray]:
    """test_native_fast's weights (test_native_quant's for the types gguf cannot quantize) and x."""
    inner = wide(qtype)
    w = quant_cases.stored(qtype, 77, inner) if qtype in EIGHT_LANES_ONLY else fast_cases.stored(qtype, 77, inner)
    return w, fast_cases.activations(rows, inner)


def fast_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier in TIERS:
        build = kernels.builds[tier]
        for case in SMALL_CASES:
            for fast in (True, False):
                yield (tier, fast, *case), batch.matmul(build, *small_step_case(*case), fast=fast)
        w, x = fast_cases.stored(Q.Q4_1, 96, 576), fast_cases.activations(1, 576)
        for fast in (True, False):
            yield (tier, "rounding", fast), batch.matmul(build, x, w, fast=fast)
        w, x = fast_cases.stored(Q.Q4_0, 45, 576), fast_cases.activations(3, 576)
        yield (tier, "together"), batch.matmul(build, x, w, fast=True)
        for i in range(3):
            yield (tier, "alone", i), batch.matmul(build, x[i : i + 1], w, fast=True)
        for (qtype, rows), fast in product(EXACT_IN_FAST, (True, False)):
            w, x = exact_in_fast_case(qtype, rows)
            yield (tier, "other", qtype, rows, fast), batch.matmul(build, x, w, fast=fast)


@pytest.fixture(scope="module")
def fast_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["fast"]


@pytest.mark.parametrize(("qtype", "inner", "outputs", "rows"), SMALL_CASES)
def test_small_steps_multiply_8_bit_x_in_integers(fast_runs: Calls, qtype: Q, inner: int, outputs: int,
                                                  rows: int) -> None:
    """The neon tier: x rounded as q8_rows rounds it, integer dot products, float32 scaling and sums, within
    q8_bound of q8_reference."""
    x, w = small_step_case(qtype, inner, outputs, rows)
    out = fast_runs["neon", True, qtype, inner, outputs, rows].result()
    assert_within(out, q8_reference(x, w), q8_bound(x, w))


@pytest.mark.parametrize(("qtype", "inner", "outputs", "rows"), SMALL_CASES)
def test_without_dot_products_small_steps_are_exact(fast_runs: Calls, qtype: Q, inner: int, outputs: int,
                                                    rows: int) -> None:
    """The generic tier has no 8-bit path: its fast precision is the exact one's floats."""
    np.testing.assert_array_equal(fast_runs["generic", True, qtype, inner, outputs, rows].result(),
                                  fast_runs["generic", False, qtype, inner, outputs, rows].result())


def test_small_steps_cost_what_rounding_x_costs(fast_runs: Calls) -> None:
    """test_native_fast's: against the exact kernels, within 1 % of the sum of the products' sizes, and far from 0
    (the rounding ran)."""
    w, x = fast_cases.stored(Q.Q4_1, 96, 576), fast_cases.activations(1, 576)
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    error = np.abs(fast_runs["neon", "rounding", True].result() - fast_runs["neon", "rounding", False].result()) / scale
    assert error.max() < 0.01 and error.mean() > 1e-5


@pytest.mark.parametrize("tier", TIERS)
def test_a_small_steps_rows_do_not_depend_on_each_other(fast_runs: Calls, tier: str) -> None:
    together = fast_runs[tier, "together"].result()
    for i in range(3):
        np.testing.assert_array_equal(fast_runs[tier, "alone", i].result(), together[i : i + 1])


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("qtype", "rows"), EXACT_IN_FAST)
def test_other_steps_are_exact(fast_runs: Calls, tier: str, qtype: Q, rows: int) -> None:
    """Small steps on the other weight types, and steps of 4 rows and more: the exact precision's floats."""
    np.testing.assert_array_equal(fast_runs[tier, "other", qtype, rows, True].result(),
                                  fast_runs[tier, "other", qtype, rows, False].result())


# --- the same floats as the avx2 tier -----------------------------------------------------------------------------

CROSS_TYPES = (Q.F32, *ALL_TYPES)


@cache
def cross_case(qtype: Q, rows: int) -> tuple[np.ndarray, Matrix]:
    """test_native_quant's Haswell comparison's weights (float32: the Q8_0 matrix's values)."""
    w = quant_cases.stored(Q.Q8_0 if qtype == Q.F32 else qtype, 29, wide(qtype), seed=int(qtype))
    return quant_cases.activations(rows, wide(qtype)), w.dequantize() if qtype == Q.F32 else w


@cache
def fast_cross_case(qtype: Q, rows: int) -> tuple[np.ndarray, Matrix]:
    inner = fast_cases.small_width(qtype, 576)
    return fast_cases.activations(rows, inner, seed=rows), fast_cases.stored(qtype, 37, inner, seed=int(qtype))


def cross_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier, qtype, rows in product(TIERS, CROSS_TYPES, (1, 2, 5)):
        yield (tier, qtype, rows), batch.matmul(kernels.builds[tier], *cross_case(qtype, rows))
    for qtype, rows in product(fast_cases.SMALL_TYPES, SMALL_STEP_ROWS):
        yield ("fast", qtype, rows), batch.matmul(kernels.builds["neon"], *fast_cross_case(qtype, rows), fast=True)


@pytest.fixture(scope="module")
def cross_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["cross"]


@pytest.fixture
def avx2_matmul(matmul_for: Callable[[CpuTier, bool], NativeMatmul]) -> Callable[[bool], NativeMatmul]:
    """The avx2 tier's projections (AVX2, FMA and F16C; 8-lane sums), run on this host, exact or fast."""
    return lambda fast: matmul_for(find("avx2", X86), fast)


@pytest.mark.usefixtures("avx2")
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", CROSS_TYPES, ids=lambda t: t.name)
def test_exact_projections_are_the_avx2_tiers_floats(cross_runs: Calls, avx2_matmul: Callable[[bool], NativeMatmul],
                                                     tier: str, qtype: Q) -> None:
    """Each weight dequantized to gguf's value, every product one FMA, the lanes summed in hsum_pairs' order:
    the avx2 tier's floats, bit for bit, in tiles (1-2 rows), register blocks (5) and tail rows."""
    for rows in (1, 2, 5):
        x, w = cross_case(qtype, rows)
        np.testing.assert_array_equal(cross_runs[tier, qtype, rows].result(), avx2_matmul(False).project(x, w))


@pytest.mark.usefixtures("avx2")
@pytest.mark.parametrize("qtype", fast_cases.SMALL_TYPES, ids=lambda t: t.name)
def test_small_steps_are_the_avx2_tiers_floats(cross_runs: Calls, avx2_matmul: Callable[[bool], NativeMatmul],
                                               qtype: Q) -> None:
    """The neon tier's 8-bit small steps: x rounded alike, exact integer dots, the same float operations in the
    same order as AVX2's pmaddubsw path, so the same floats (test_native_fast's check across the x86 tiers)."""
    fast = avx2_matmul(True)
    assert fast.fast_small_steps
    for rows in SMALL_STEP_ROWS:
        x, w = fast_cross_case(qtype, rows)
        np.testing.assert_array_equal(cross_runs["fast", qtype, rows].result(), fast.project(x, w))


# --- attention (test_native_attention, test_kv_float16) -----------------------------------------------------------

PARALLEL = (0, 1 << 40)  # always / never shared among the threads
DECODE_CASES = [(heads, kv_heads, dim, block_size, parallel)
                for heads, kv_heads, dim in [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 1, 32), (5, 5, 8)]
                for block_size in (1, 16, 32) for parallel in PARALLEL]
CHUNK_CASES = [(heads, kv_heads, dim, block_size, chunk, context)
               for heads, kv_heads, dim in [(9, 3, 64), (8, 2, 128), (5, 5, 8)] for block_size in (1, 16)
               for chunk, context in [(1, 1), (7, 7), (100, 100), (33, 290)]]
HALF_DECODE_CASES = [(heads, kv_heads, dim, block_size, parallel)
                     for heads, kv_heads, dim in [(9, 3, 64), (8, 2, 128), (6, 1, 32), (5, 5, 8), (2, 1, 264)]
                     for block_size in (1, 16) for parallel in PARALLEL]
HALF_CHUNK_CASES = [(heads, kv_heads, dim, chunk, context) for heads, kv_heads, dim in [(9, 3, 64), (5, 5, 8)]
                    for chunk, context in [(1, 1), (7, 7), (33, 290)]]


@dataclass(frozen=True, eq=False)  # hashed by identity: the references are cached by case (each built once)
class Decode:
    """One decode call's inputs: a query per sequence, the paged cache (float32 or float16), tables, lengths."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    tables: np.ndarray
    lens: np.ndarray


@dataclass(frozen=True, eq=False)
class Chunk:
    """One prefill chunk's queries, the cache and the sequence's table, and its context length."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    table: np.ndarray
    context: int


@cache
def decode_case(heads: int, kv_heads: int, dim: int, block_size: int) -> Decode:
    rng = np.random.default_rng(heads * 1000 + dim + block_size)
    lens = [1, 2, block_size, block_size + 1, 7, 100, 257]
    return Decode(*paged_problem(rng, lens, heads, kv_heads, dim, block_size))


@cache
def chunk_case(heads: int, kv_heads: int, dim: int, block_size: int, chunk: int, context: int) -> Chunk:
    rng = np.random.default_rng(chunk * 1000 + context + dim)
    _, k, v, tables, _ = paged_problem(rng, [context], heads, kv_heads, dim, block_size)
    return Chunk(rng.standard_normal((chunk, heads, dim), dtype=np.float32) * 3, k, v, tables[0], context)


@cache
def half_decode_case(heads: int, kv_heads: int, dim: int, block_size: int) -> Decode:
    rng = np.random.default_rng(heads * 100 + dim + block_size)
    q, k, v, tables, lens = paged_problem(rng, [1, 2, block_size + 1, 7, 100, 257], heads, kv_heads, dim, block_size)
    return Decode(q, *half_cache(k, v), tables, lens)


@cache
def half_chunk_case(heads: int, kv_heads: int, dim: int, chunk: int, context: int) -> Chunk:
    rng = np.random.default_rng(chunk * 1000 + context + dim)
    _, k, v, tables, _ = paged_problem(rng, [context], heads, kv_heads, dim, 16)
    return Chunk(rng.standard_normal((chunk, heads, dim), dtype=np.float32) * 3, *half_cache(k, v), tables[0], context)


def large_scores_case() -> Decode:
    q, k, v, tables, lens = paged_problem(np.random.default_rng(7), [40, 3], 9, 3, 64, 16)
    return Decode(q * 100, k, v, tables, lens)


def queue_decode(batch: Batch, build: Build, case: Decode, parallel_min_tokens: int) -> Call:
    return batch.decode(build, case.q, case.k, case.v, case.tables, case.lens, parallel_min_tokens)


def queue_chunk(batch: Batch, build: Build, case: Chunk) -> Call:
    return batch.chunk(build, case.q, case.k, case.v, case.table, case.context, 0)  # 0: shared among threads


def attention_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier in TIERS:
        build = kernels.builds[tier]
        for label, cases, make in (("decode", DECODE_CASES, decode_case),
                                   ("half decode", HALF_DECODE_CASES, half_decode_case)):
            for *shape, parallel in cases:
                yield (tier, label, *shape, parallel), queue_decode(batch, build, make(*shape), parallel)
        for chunk in CHUNK_CASES:
            yield (tier, "chunk", *chunk), queue_chunk(batch, build, chunk_case(*chunk))
        for half_chunk in HALF_CHUNK_CASES:
            yield (tier, "half chunk", *half_chunk), queue_chunk(batch, build, half_chunk_case(*half_chunk))
        yield (tier, "large scores"), queue_decode(batch, build, large_scores_case(), 2048)


@pytest.fixture(scope="module")
def attention_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["attention"]


@cache
def decode_reference(case: Decode) -> tuple[np.ndarray, np.ndarray]:
    """The attention in float64 on the cache's values (widening float16 is exact), and bounds.attention_bound of
    a float32 kernel's error (test_native_attention's and test_kv_float16's)."""
    q, k, tables = case.q.astype(np.float64), case.k.astype(np.float64), np.maximum(case.tables, 0)
    reference, weighted = (decode_attention(q, k, values.astype(np.float64), tables, case.lens)
                           for values in (case.v, np.abs(case.v)))
    return reference, attention_bound(case.q, case.k, weighted, int(case.lens.max()))


@cache
def chunk_reference(case: Chunk) -> tuple[np.ndarray, np.ndarray]:
    """As decode_reference, for a chunk."""
    q, k, table = case.q.astype(np.float64), case.k.astype(np.float64), np.maximum(case.table, 0)
    reference, weighted = (prefill_attention(q, k, values.astype(np.float64), table, case.context)
                           for values in (case.v, np.abs(case.v)))
    return reference, attention_bound(case.q, case.k, weighted, case.context)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "parallel"), DECODE_CASES)
def test_decode_matches_the_reference(attention_runs: Calls, tier: str, heads: int, kv_heads: int, dim: int,
                                      block_size: int, parallel: int) -> None:
    out = attention_runs[tier, "decode", heads, kv_heads, dim, block_size, parallel].result()
    assert_within(out, *decode_reference(decode_case(heads, kv_heads, dim, block_size)))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "chunk", "context"), CHUNK_CASES)
def test_chunk_matches_the_prefill_reference(attention_runs: Calls, tier: str, heads: int, kv_heads: int, dim: int,
                                             block_size: int, chunk: int, context: int) -> None:
    out = attention_runs[tier, "chunk", heads, kv_heads, dim, block_size, chunk, context].result()
    assert_within(out, *chunk_reference(chunk_case(heads, kv_heads, dim, block_size, chunk, context)))


@pytest.mark.parametrize("tier", TIERS)
def test_large_scores_do_not_overflow(attention_runs: Calls, tier: str) -> None:
    """test_native_attention's: scores in the thousands, to their float32 conditioning (atol 1e-3), finite."""
    case = large_scores_case()
    out = attention_runs[tier, "large scores"].result()
    reference = decode_attention(case.q, case.k, case.v, np.maximum(case.tables, 0), case.lens)
    np.testing.assert_allclose(out, reference, atol=1e-3)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "parallel"), HALF_DECODE_CASES)
def test_decode_over_a_float16_cache(attention_runs: Calls, tier: str, heads: int, kv_heads: int, dim: int,
                                     block_size: int, parallel: int) -> None:
    """The specialised copies, the generic, and a head too wide to widen once (264): float32's bound."""
    out = attention_runs[tier, "half decode", heads, kv_heads, dim, block_size, parallel].result()
    assert_within(out, *decode_reference(half_decode_case(heads, kv_heads, dim, block_size)))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "chunk", "context"), HALF_CHUNK_CASES)
def test_a_chunk_over_a_float16_cache(attention_runs: Calls, tier: str, heads: int, kv_heads: int, dim: int,
                                      chunk: int, context: int) -> None:
    out = attention_runs[tier, "half chunk", heads, kv_heads, dim, chunk, context].result()
    assert_within(out, *chunk_reference(half_chunk_case(heads, kv_heads, dim, chunk, context)))


# --- half.h's conversions (test_kv_float16) -----------------------------------------------------------------------


def half_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    x = awkward_floats()
    with np.errstate(over="ignore"):
        halves = x.astype(np.float16)
    for tier in TIERS:
        yield (tier, "round"), batch.round_to_half(kernels.builds[tier], x)
        yield (tier, "widen"), batch.widen_half(kernels.builds[tier], halves)


@pytest.fixture(scope="module")
def half_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["half"]


@pytest.mark.parametrize("tier", TIERS)
def test_conversions_are_numpys_bit_for_bit(half_runs: Calls, tier: str) -> None:
    """Every float16, ties, their neighbours, subnormals, overflow, infinities, NaN: stores round to nearest,
    ties to even, as NumPy's astype(float16); loads widen exactly."""
    x = awkward_floats()
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    rounded = half_runs[tier, "round"].result()
    same = (rounded.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(rounded) & np.isnan(expected))
    assert same.all(), x[~same][:8]
    np.testing.assert_array_equal(half_runs[tier, "widen"].result(), expected.astype(np.float32))


# --- the sampler (test_native_sampling) ---------------------------------------------------------------------------

SAMPLING_VOCABS = (7, 1003, 4099)
SAMPLING_ROWS = 24


@cache
def sampling_case(vocab: int, top_k: int, top_p: float) -> tuple[np.ndarray, ...]:
    """Random rows, temperatures, min_p on every other row, the filters, uniforms."""
    rng = np.random.default_rng(vocab + top_k)
    rows = SAMPLING_ROWS
    logits = sampling_cases.random_rows(rng, rows, vocab)
    temperature = rng.uniform(0.3, 1.7, rows).astype(np.float32)
    min_p = np.where(np.arange(rows) % 2 == 0, 0.0, rng.uniform(0.0, 0.2, rows)).astype(np.float32)
    return (logits, temperature, min_p, np.full(rows, top_k, np.int64), np.full(rows, top_p, np.float32),
            rng.random(rows))


LOGPROBS_K = 5


def sampling_calls(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
    for tier, vocab, (top_k, top_p) in product(TIERS, SAMPLING_VOCABS, sampling_cases.FILTERS):
        yield (tier, vocab, top_k, top_p), batch.sample(kernels.builds[tier], *sampling_case(vocab, top_k, top_p))
    for tier, vocab in product(TIERS, SAMPLING_VOCABS):
        logits = sampling_case(vocab, 0, 1.0)[0]
        tokens = np.arange(SAMPLING_ROWS) % vocab
        yield (tier, vocab, "logprobs"), batch.logprobs(kernels.builds[tier], logits, tokens, min(LOGPROBS_K, vocab))


@pytest.fixture(scope="module")
def sampling_runs(aarch64_runs: dict[str, Calls]) -> Calls:
    return aarch64_runs["sampling"]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("vocab", SAMPLING_VOCABS)
@pytest.mark.parametrize("filters", sampling_cases.FILTERS, ids=lambda f: f"top_k={f[0]},top_p={f[1]}")
def test_draws_are_the_exact_inverse_cdf(sampling_runs: Calls, tier: str, vocab: int,
                                         filters: tuple[int, float]) -> None:
    """The x86 sampler tests' float64 reference: the same token wherever the target is not at a boundary."""
    logits, temperature, min_p, _, top_p, uniforms = sampling_case(vocab, *filters)
    drawn = sampling_runs[tier, vocab, *filters].result()
    checked = 0
    for r in range(SAMPLING_ROWS):
        want, margin = sampling_cases.reference(logits[r], float(temperature[r]), float(min_p[r]),
                                                float(uniforms[r]), filters[0], float(top_p[r]))
        if margin > sampling_cases.MARGIN:
            assert drawn[r] == want, (r, drawn[r], want)
            checked += 1
    assert checked >= SAMPLING_ROWS - 1


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("vocab", SAMPLING_VOCABS)
def test_logprobs_are_the_log_softmax(sampling_runs: Calls, tier: str, vocab: int) -> None:
    logits, k = sampling_case(vocab, 0, 1.0)[0], min(LOGPROBS_K, vocab)
    chosen, ids, values = cross.split_logprobs(sampling_runs[tier, vocab, "logprobs"].result(), SAMPLING_ROWS, k)
    want = sampling_cases.reference_logprobs(logits)
    rows = np.arange(SAMPLING_ROWS)
    np.testing.assert_allclose(chosen, want[rows, rows % vocab], rtol=1e-6, atol=2e-5)
    order = np.argsort(-want, axis=-1, kind="stable")[:, :k]
    assert ids.tolist() == order.tolist()
    np.testing.assert_allclose(values, np.take_along_axis(want, order, axis=-1), rtol=1e-6, atol=2e-5)


BATCHES: dict[str, Make] = {"probes": probe_calls, "float32": float32_calls, "stored": stored_calls, "fast": fast_calls,
                            "cross": cross_calls, "attention": attention_calls, "half": half_calls,
                            "sampling": sampling_calls}
