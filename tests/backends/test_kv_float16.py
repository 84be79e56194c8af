"""The KV cache in float16 (backend.kv_cache_dtype): the conversions against NumPy's, the C attention kernels and
the fused step reading (and writing) a float16 cache against the NumPy reference over the same cache, the
backend's geometry, and greedy decoding through the default model against a float32 cache."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError, StepBatch
from backends.config import BackendConfig
from backends.model.loader import LoadedModel
from backends.numpy_backend.attention import decode_attention, prefill_attention
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.build import SOURCE_DIR
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.kernels import NativeAttention
from tests.backends.bounds import assert_within, attention_bound
from tests.backends.compiler import flags_for, start_checked_compile
from tests.backends.test_native_attention import paged_problem
from tests.backends.test_native_fused_step import Pair, assert_same_step, cut

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips
HALF_ULP = 2.0**-10  # float16's spacing relative to a value: two roundings of nearby floats may differ by it

@pytest.fixture(scope="module")
def cache_dir(kernel_cache: Path) -> Path:
    return kernel_cache


@pytest.fixture(scope="module")
def model(real_model_stored: LoadedModel) -> LoadedModel:
    return real_model_stored


def build_half_check(c_compiler: str, tier: CpuTier, directory: Path) -> ctypes.CDLL:
    """half_check.c for the tier, without warnings (compiled again only when its inputs changed)."""
    flags = [*flags_for(tier), "-Wall", "-Werror", f"-I{SOURCE_DIR}"]
    build = start_checked_compile(c_compiler, flags, [Path(__file__).parent / "half_check.c"],
                                  directory / f"half_check-{tier.name}.so")
    status, errors = build.wait()
    assert status == 0, errors
    built = ctypes.CDLL(str(build.output))
    for fn in (built.round_to_half, built.widen_half):
        fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return built


def awkward_floats() -> np.ndarray:
    """Every float16 and the floats halfway between neighbours (ties), just either side of them, subnormals,
    values past the largest float16, infinities, NaN, zeros and random values of every magnitude."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.sort(halves[np.isfinite(halves)])
    ties = (finite[:-1].astype(np.float64) + finite[1:]) / 2
    near = np.concatenate([np.nextafter(ties.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(ties.astype(np.float32), np.float32(-np.inf))])
    edges = np.array([65504, 65519.99, 65520, 1e6, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-8, 2.0**-25, 2.0**-24,
                      3 * 2.0**-26, 1e-40], np.float32)
    rng = np.random.default_rng(0)
    random = (rng.standard_normal(1 << 15) * np.exp2(rng.uniform(-30, 18, 1 << 15))).astype(np.float32)
    values = np.concatenate([halves, ties.astype(np.float32), near, edges, -edges, random]).astype(np.float32)
    return np.concatenate([values, np.zeros(-len(values) % 8, np.float32)])


def test_conversions_are_numpys_bit_for_bit(c_compiler: str, tmp_path: Path, tier: CpuTier) -> None:
    """Stores round to nearest, ties to even, as NumPy's astype(float16); loads widen exactly. On every tier:
    with F16C and without it (the generic tier: the conversions one by one)."""
    library = build_half_check(c_compiler, tier, tmp_path)
    x = awkward_floats()
    rounded = np.empty(len(x), np.float16)
    library.round_to_half(x.ctypes.data, len(x), rounded.ctypes.data)
    with np.errstate(over="ignore"):  # past 65504: infinity, as the kernels give
        expected = x.astype(np.float16)
    same = (rounded.view(np.uint16) == expected.view(np.uint16)) | (np.isnan(rounded) & np.isnan(expected))
    assert same.all(), x[~same][:8]
    widened = np.empty(len(x), np.float32)
    library.widen_half(expected.ctypes.data, len(x), widened.ctypes.data)
    np.testing.assert_array_equal(widened, expected.astype(np.float32))


def half_cache(k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return k.astype(np.float16), v.astype(np.float16)


def widened(k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return k.astype(np.float32), v.astype(np.float32)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (6, 1, 32), (5, 5, 8), (2, 1, 264)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("parallel_min_tokens", [0, 1 << 40])
def test_decode_over_a_float16_cache_matches_the_reference(tier: CpuTier, cache_dir: Path, heads: int, kv_heads: int,
                                                           dim: int, block_size: int, parallel_min_tokens: int
                                                           ) -> None:
    """Widening is exact, so the reference runs on the float16 cache's values, in float64, and the tolerance is
    float32's, not float16's. The specialised copies (group 3, head_dim 64 and 128), the generic, and a head
    too wide to widen once (264: read in place)."""
    rng = np.random.default_rng(heads * 100 + dim + block_size)
    q, k, v, tables, ctx = paged_problem(rng, [1, 2, block_size + 1, 7, 100, 257], heads, kv_heads, dim, block_size)
    k, v = half_cache(k, v)
    out = NativeAttention(parallel_min_tokens, cache_dir, tier).decode(q, k, v, tables, ctx)
    tables = np.maximum(tables, 0)
    ref = decode_attention(*as_float64(q, *widened(k, v)), tables, ctx)
    weighted = decode_attention(*as_float64(q, *widened(k, np.abs(v))), tables, ctx)
    assert_within(out, ref, attention_bound(q, k, weighted, int(ctx.max())))


def as_float64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (5, 5, 8)])
@pytest.mark.parametrize(("chunk", "context"), [(1, 1), (7, 7), (33, 290)])
def test_a_chunk_over_a_float16_cache_matches_the_reference(tier: CpuTier, cache_dir: Path, heads: int, kv_heads: int,
                                                            dim: int, chunk: int, context: int) -> None:
    rng = np.random.default_rng(chunk * 1000 + context + dim)
    _, k, v, tables, _ = paged_problem(rng, [context], heads, kv_heads, dim, 16)
    k, v = half_cache(k, v)
    q = rng.standard_normal((chunk, heads, dim), dtype=np.float32) * 3
    out = NativeAttention(0, cache_dir, tier).chunk(q, k, v, tables[0], context)
    table = np.maximum(tables[0], 0)
    ref, weighted = (prefill_attention(*as_float64(q, *widened(k, values)), table, context)
                     for values in (v, np.abs(v)))
    assert_within(out, ref, attention_bound(q, k, weighted, context))


def test_a_cache_of_another_type_is_refused(tier: CpuTier, cache_dir: Path) -> None:
    """Mixed or other element types would be read as the wrong bytes: refused before the call."""
    q, k, v, tables, ctx = paged_problem(np.random.default_rng(1), [5], 4, 4, 16, 4)
    attention = NativeAttention(cache_dir=cache_dir, tier=tier)
    for keys, values in ((k.astype(np.float64), v.astype(np.float64)), (k.astype(np.float16), v)):
        with pytest.raises(ValueError, match="float32 or float16"):
            attention.decode(q, keys, values, tables, ctx)
        with pytest.raises(ValueError, match="float32 or float16"):
            attention.chunk(q, keys, values, tables[0], 5)


def assert_same_half_step(pair: Pair, batch: StepBatch) -> None:
    """Within the fused-step tests' float16 tolerances (test_native_fused_step.HALF_TOLERANCES); the first
    layer's K/V, whose inputs are the same on both sides, within one float16 rounding of the reference's."""
    assert all(c.dtype == np.float16 for side in (pair.fused.cache, pair.reference.cache)
               for c in (*side.keys, *side.values))
    assert_same_step(pair, batch)
    for fused, ref in ((pair.fused.cache.keys[0], pair.reference.cache.keys[0]),
                       (pair.fused.cache.values[0], pair.reference.cache.values[0])):
        np.testing.assert_allclose(fused.astype(np.float32), ref.astype(np.float32), atol=1e-6, rtol=HALF_ULP)


@pytest.mark.parametrize("block_size", [1, 16])
def test_the_fused_step_over_a_float16_cache_matches_the_numpy_forward(model: LoadedModel, real_model: LoadedModel,
                                                                       block_size: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The default model cut to two layers (test_native_fused_step.cut): decodes at mixed lengths, then a step of a
    decode, a chunk continuing a cached prefix, a whole new prompt and another decode (the chunk kernel's gather
    widening float16); both in the fused step. The reference reads the float32 copy of the weights: the same
    floats as the stored ones."""
    assert_half_steps_match(cut(model), cut(real_model), block_size, monkeypatch)


def test_the_whole_default_model_over_a_float16_cache_matches_the_numpy_forward(
        model: LoadedModel, real_model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """All its layers and its whole head, blocks of 16."""
    assert_half_steps_match(model, real_model, 16, monkeypatch)


def assert_half_steps_match(model: LoadedModel, float32_copy: LoadedModel, block_size: int,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    pair = Pair(model, 2048 // block_size, block_size, kv_cache_dtype="float16", float32_copy=float32_copy)
    calls = pair.fused_calls(monkeypatch)
    assert_same_half_step(pair, pair.decode_batch([1, 9, 16, 17, 100, 255, 33]))
    assert_same_half_step(pair, pair.step_batch([40, 17, 0, 100], [1, 7, 20, 1]))
    assert calls == [7, 29]


def test_the_backend_holds_twice_the_tokens_in_the_same_memory(model: LoadedModel) -> None:
    wide, narrow = NumpyBackend(model), NumpyBackend(model, kv_cache_dtype="float16")
    assert wide.kv_geometry.dtype_bytes == 2 * narrow.kv_geometry.dtype_bytes == 4
    narrow.init_cache(8, 16)
    assert {c.dtype for c in (*narrow.cache.keys, *narrow.cache.values)} == {np.dtype(np.float16)}
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        BackendConfig(kv_cache_dtype="int8")
    with pytest.raises(BackendError, match="kv_cache_dtype"):
        NumpyBackend(model, kv_cache_dtype="float64")
    for other in ("cupy", "sim"):  # their caches are not the numpy backend's: refused, not ignored
        with pytest.raises(ValueError, match="numpy backend setting"):
            BackendConfig(name=other, kv_cache_dtype="float16")


def test_greedy_decoding_over_a_float16_cache_follows_the_float32_one(model: LoadedModel) -> None:
    """8 chat prompts decoded together for 16 tokens: the continuations agree token for token with a float32
    cache's, most of them throughout (bench.precision: 19 of 20 prompts for all of 128 tokens)."""
    from bench.precision import agreement, greedy, prompts  # noqa: PLC0415 - the benchmark's own helpers

    ids = prompts(model, 8)
    outs = [greedy(NumpyBackend(model, "native", kv_cache_dtype=dtype), model, ids, 16)
            for dtype in ("float32", "float16")]
    matched = agreement(*outs, 16).matched
    assert sorted(matched)[len(matched) // 2] >= 12 and min(matched) >= 4, matched


def test_the_setting_doubles_the_blocks_a_memory_budget_holds(caplog: pytest.LogCaptureFixture) -> None:
    """PAGEDSERVE_KV_CACHE_DTYPE through the server's own assembly: the same kv_cache_memory gives twice the
    blocks, the start-up log says so, and the backend's cache is float16. A value outside the choices is refused
    naming the setting."""
    from service.app.assemble import build_parts  # noqa: PLC0415 - the service assembles the backend and the pool
    from service.config.settings import ConfigError, load_config  # noqa: PLC0415

    env = {"PAGEDSERVE_KV_CACHE_MEMORY": "48MiB"}
    wide = build_parts(load_config(env=env))
    config = load_config(env={**env, "PAGEDSERVE_KV_CACHE_DTYPE": "float16"})
    with caplog.at_level(logging.INFO, logger="service.app.assemble"):
        narrow = build_parts(config)
    assert narrow.kv.num_blocks == 2 * wide.kv.num_blocks > 0
    blocks, size, geo = narrow.kv.num_blocks, config.kv.block_size, narrow.backend.kv_geometry
    mib = blocks * size * 2 * geo.num_layers * geo.num_kv_heads * geo.head_dim * geo.dtype_bytes / 2**20
    line = f"KV cache: {blocks} blocks of {size} tokens ({blocks * size} tokens, {mib:.1f} MiB at 2 bytes a value"
    assert line in caplog.text and 47 < mib <= 48
    assert isinstance(narrow.backend, NumpyBackend) and narrow.backend.cache.keys[0].dtype == np.float16
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        load_config(env={"PAGEDSERVE_KV_CACHE_DTYPE": "int8"})
