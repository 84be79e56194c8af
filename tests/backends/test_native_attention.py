"""The C decode-attention kernel against its NumPy reference, the kernels' build and cache, and the backend's
choice of kernels."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError
from backends.model.config import ModelConfig
from backends.model.weights import ModelWeights
from backends.numpy_backend.attention import decode_attention, prefill_attention
from backends.numpy_backend.kernel_choice import choose_kernels
from backends.numpy_backend.native.build import OPENMP, SOURCE_DIR, KernelBuildError, build_library
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier
from backends.numpy_backend.native.fused_step import NativeFusedStep
from backends.numpy_backend.native.kernels import NativeAttention
from backends.numpy_backend.native.matmul import NativeMatmul, numpy_project
from backends.numpy_backend.native.sampler import NativeSampler
from tests.backends.bounds import assert_within, attention_bound
from tests.backends.compiler import OWN_TIERS, flags_for, require_gcc, start_checked_compile
from tests.backends.tiers import RUNNABLE

pytestmark = pytest.mark.usefixtures("c_compiler")  # CI=true: a missing compiler fails, elsewhere skips


def model_of(head_dim: int) -> tuple[ModelConfig, ModelWeights]:
    """A model shape of 9 query heads over 3 kv heads; the choice only hands the weights on, so none are made."""
    config = ModelConfig("shape", "llama", 2, 576, 1536, 9, 3, head_dim, 1e4, 1e-5, 100, 256, 1, (2,))
    return config, ModelWeights(np.zeros((100, 576), np.float32), (), np.ones(576, np.float32),
                                np.zeros((100, 576), np.float32))


@pytest.fixture(scope="module")
def cache_dir(kernel_cache: Path) -> Path:
    return kernel_cache


def as_float64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


def paged_problem(rng: np.random.Generator, lens: list[int], heads: int, kv_heads: int, dim: int,
                  block_size: int) -> tuple[np.ndarray, ...]:
    """Random q and K/V in a pool whose blocks are handed to the sequences in shuffled order, tables padded."""
    per_seq = [-(-n // block_size) for n in lens]
    pool = sum(per_seq) + 3
    k = rng.standard_normal((pool, block_size, kv_heads, dim), dtype=np.float32)
    v = rng.standard_normal((pool, block_size, kv_heads, dim), dtype=np.float32)
    order = rng.permutation(pool)
    tables = np.full((len(lens), max(per_seq) + 2), -1, np.int32)  # -1 padding past each table: never read
    start = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = order[start : start + n]
        start += n
    q = rng.standard_normal((len(lens), heads, dim), dtype=np.float32) * 3  # sharp softmaxes too
    return q, k, v, tables, np.array(lens, np.int32)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 1, 32), (5, 5, 8)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("parallel_min_tokens", [0, 1 << 40])  # always / never shared among threads
def test_matches_reference(tier: CpuTier, cache_dir: Path, heads: int, kv_heads: int, dim: int, block_size: int,
                           parallel_min_tokens: int) -> None:
    rng = np.random.default_rng(heads * 1000 + dim + block_size)
    lens = [1, 2, block_size, block_size + 1, 7, 100, 257]
    q, k, v, tables, ctx = paged_problem(rng, lens, heads, kv_heads, dim, block_size)
    out = NativeAttention(parallel_min_tokens, cache_dir, tier).decode(q, k, v, tables, ctx)
    tables = np.maximum(tables, 0)
    ref, weighted = (decode_attention(*as_float64(q, k, values), tables, ctx) for values in (v, np.abs(v)))
    assert_within(out, ref, attention_bound(q, k, weighted, max(lens)))


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (5, 5, 8)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize(("chunk", "context"), [(1, 1), (7, 7), (100, 100), (33, 290)])
def test_chunk_matches_the_prefill_reference(tier: CpuTier, cache_dir: Path, heads: int, kv_heads: int, dim: int,
                                             block_size: int, chunk: int, context: int) -> None:
    """A prefill chunk (the last `chunk` of `context` positions, so a whole prompt or one continuing a cached
    prefix; one tile, several, and a partial last one) against the masked-matrix reference."""
    rng = np.random.default_rng(chunk * 1000 + context + dim)
    q, k, v, tables, _ = paged_problem(rng, [context], heads, kv_heads, dim, block_size)
    q = rng.standard_normal((chunk, heads, dim), dtype=np.float32) * 3
    out = NativeAttention(0, cache_dir, tier).chunk(q, k, v, tables[0], context)
    table = np.maximum(tables[0], 0)
    ref, weighted = (prefill_attention(*as_float64(q, k, values), table, context) for values in (v, np.abs(v)))
    assert_within(out, ref, attention_bound(q, k, weighted, context))


WINDOWS = [1, 5, 8, 16, 100]


# (4, 1, 256) and (8, 4, 256): Gemma 3's shapes, whose value sums take strips of columns (attention.h)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 256), (8, 4, 256), (5, 5, 8)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("parallel_min_tokens", [0, 1 << 40])
def test_a_sliding_layers_decode_matches_the_reference(tier: CpuTier, cache_dir: Path, heads: int, kv_heads: int,
                                                       dim: int, block_size: int, parallel_min_tokens: int) -> None:
    """Each query over the last `window` positions: windows shorter and longer than the context, starting inside
    a block and on a block's edge, in a batch of sequences (the next one's keys prefetched from its window)."""
    attention = NativeAttention(parallel_min_tokens, cache_dir, tier)
    for window in WINDOWS:
        rng = np.random.default_rng(window * 100 + dim + block_size)
        lens = [1, window - 1 or 1, window, window + 1, 17, 100, 257]
        q, k, v, tables, ctx = paged_problem(rng, lens, heads, kv_heads, dim, block_size)
        out = attention.decode(q, k, v, tables, ctx, window)
        tables = np.maximum(tables, 0)
        ref, weighted = (decode_attention(*as_float64(q, k, values), tables, ctx, window) for values in (v, np.abs(v)))
        # attention_bound over the keys a query sees: at most `window`
        assert_within(out, ref, attention_bound(q, k, weighted, min(window, max(lens))))


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 256)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize(("chunk", "context"), [(1, 1), (7, 7), (40, 40), (33, 290)])
def test_a_sliding_layers_chunk_matches_the_prefill_reference(tier: CpuTier, cache_dir: Path, heads: int,
                                                              kv_heads: int, dim: int, block_size: int, chunk: int,
                                                              context: int) -> None:
    """A chunk's queries each over their own window: windows inside one tile, across tiles, longer than the
    context; the gathered positions start at the first query's window (inside a block)."""
    attention = NativeAttention(0, cache_dir, tier)
    for window in WINDOWS:
        rng = np.random.default_rng(chunk * 1000 + context + dim + window)
        q, k, v, tables, _ = paged_problem(rng, [context], heads, kv_heads, dim, block_size)
        q = rng.standard_normal((chunk, heads, dim), dtype=np.float32) * 3
        out = attention.chunk(q, k, v, tables[0], context, window)
        table = np.maximum(tables[0], 0)
        ref, weighted = (prefill_attention(*as_float64(q, k, values), table, context, window)
                         for values in (v, np.abs(v)))
        assert_within(out, ref, attention_bound(q, k, weighted, min(window, context)))


def test_chunk_refusals(tier: CpuTier, cache_dir: Path) -> None:
    """A chunk longer than its context, a context past its table, a block outside the cache: errors, no read."""
    q, k, v, tables, _ = paged_problem(np.random.default_rng(3), [8], 9, 3, 64, 4)
    attention = NativeAttention(cache_dir=cache_dir, tier=tier)
    with pytest.raises(ValueError, match="chunk longer"):
        attention.chunk(np.zeros((9, 9, 64), np.float32), k, v, tables[0], 8)
    with pytest.raises(ValueError, match="outside its block table"):
        attention.chunk(np.zeros((2, 9, 64), np.float32), k, v, tables[0][:1], 8)
    bad = tables[0].copy()
    bad[1] = k.shape[0]
    with pytest.raises(ValueError, match="block outside the cache"):
        attention.chunk(np.zeros((2, 9, 64), np.float32), k, v, bad, 8)
    with pytest.raises(ValueError, match="1-D ints"):
        attention.chunk(np.zeros((2, 9, 64), np.float32), k, v, tables[0] + 0.5, 8)
    with pytest.raises(ValueError, match="unsupported head shape"):
        attention.chunk(np.zeros((2, 0, 64), np.float32), k, v, tables[0], 8)
    assert attention.chunk(np.zeros((0, 9, 64), np.float32), k, v, tables[0], 8).shape == (0, 9, 64)


def test_large_scores_do_not_overflow(tier: CpuTier, cache_dir: Path) -> None:
    """exp is taken after subtracting the row max, so scores in the thousands still give a softmax (to the
    float32 conditioning of such scores: a rounding of 1e-4 in a score of 1000 moves its weight by 1e-4)."""
    rng = np.random.default_rng(7)
    q, k, v, tables, ctx = paged_problem(rng, [40, 3], 9, 3, 64, 16)
    out = NativeAttention(cache_dir=cache_dir, tier=tier).decode(q * 100, k, v, tables, ctx)
    # scores up to 985, 64-term float32 sums: a typical error of sqrt(64) * 2^-24 of their terms' sizes (~2000) is
    # ~1e-3 in a score, moving a weight by 1e-3 of itself; measured 1.6e-4 here (each side within 1.2e-4 of float64)
    np.testing.assert_allclose(out, decode_attention(q * 100, k, v, np.maximum(tables, 0), ctx), atol=1e-3)
    assert np.isfinite(out).all()


def test_rejects_what_the_kernel_cannot_do(tier: CpuTier, cache_dir: Path) -> None:
    attention = NativeAttention(cache_dir=cache_dir, tier=tier)
    rng = np.random.default_rng(0)
    q, k, v, tables, ctx = paged_problem(rng, [5], 4, 4, 12, 4)
    with pytest.raises(ValueError, match="unsupported"):
        attention.decode(q, k, v, tables, ctx)
    q, k, v, tables, ctx = paged_problem(rng, [5], 4, 4, 16, 4)
    with pytest.raises(ValueError, match="context length"):
        attention.decode(q, k, v, tables, ctx + 100)
    with pytest.raises(ValueError, match="must be integers"):  # not cast: 1.7 would read block 1
        attention.decode(q, k, v, tables + 0.7, ctx)
    assert not NativeAttention.supports(34, 2, 64) and NativeAttention.supports(32, 8, 128)


SOURCES = ("paged_attention.c", "matmul_rows.c", "fused_step.c", "sampling.c")
# Every tier of this architecture with OpenMP (those this CPU cannot run too: compiled only), and the host's own
# without it (then its pragmas are unknown).
COMPILES = [(tier, OPENMP) for tier in OWN_TIERS] + [(tier, ("-Wno-unknown-pragmas",)) for tier in RUNNABLE[-1:]]


@pytest.mark.parametrize(("target", "openmp"), COMPILES,
                         ids=lambda v: v.name if isinstance(v, CpuTier) else " ".join(v))
def test_the_sources_compile_without_warnings(tmp_path: Path, target: CpuTier, openmp: tuple[str, ...]) -> None:
    """The four sources at once (the cores share them out); a compile that passed before on the same inputs is
    not repeated (compiler.start_checked_compile)."""
    runs = [start_checked_compile("cc", [*flags_for(target), *openmp, "-Wall", "-Wextra", "-Werror"],
                                  [SOURCE_DIR / source], tmp_path / f"{source}.so") for source in SOURCES]
    for source, run in zip(SOURCES, runs, strict=True):
        status, errors = run.wait()
        assert status == 0, f"{source}: {errors}"


def stand_in_compiler(tmp_path: Path) -> str:
    """Writes its -o file, compiling nothing: which build the cache keeps and reuses does not depend on what the
    compiler makes (the kernels' real builds are the rest of the module's)."""
    path = tmp_path / "stand-in-cc"
    path.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "stand-in 1"; exit 0; }\n'
                    'while [ "$1" != -o ]; do shift; done; echo library > "$2"\n')
    path.chmod(0o755)
    return str(path)


def test_build_is_cached_and_keyed_by_source_and_headers(tmp_path: Path) -> None:
    source, header, cc = tmp_path / "paged_attention.c", tmp_path / "simd.h", stand_in_compiler(tmp_path)
    for path in [SOURCE_DIR / "paged_attention.c", *SOURCE_DIR.glob("*.h")]:
        (tmp_path / path.name).write_text(path.read_text())
    first = build_library(source, host_tier(), tmp_path / "cache", cc)
    mtime = first.stat().st_mtime_ns
    assert build_library(source, host_tier(), tmp_path / "cache", cc) == first and first.stat().st_mtime_ns == mtime
    source.write_text(source.read_text() + "\n/* changed */\n")
    second = build_library(source, host_tier(), tmp_path / "cache", cc)
    header.write_text(header.read_text() + "\n/* changed */\n")  # an included header is part of the key
    assert len({first, second, build_library(source, host_tier(), tmp_path / "cache", cc)}) == 3


def test_missing_compiler_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(KernelBuildError, match="cannot run"):
        build_library(SOURCE_DIR / "paged_attention.c", host_tier(), tmp_path, compiler="no-such-compiler-here")
    broken = tmp_path / "broken.c"
    broken.write_text("int f( {")
    with pytest.raises(KernelBuildError, match="failed"):
        build_library(broken, host_tier(), tmp_path)
    assert list(tmp_path.glob("*.so")) == []  # no half-written library left behind
    (tmp_path / "file").write_text("")
    with pytest.raises(KernelBuildError, match="cache"):
        build_library(SOURCE_DIR / "paged_attention.c", host_tier(), tmp_path / "file" / "sub")  # unwritable cache


def compiler_without_openmp(tmp_path: Path, calls: Path) -> Path:
    """A cc that rejects -fopenmp, logging its command lines to `calls`. Given build.py's command for the host's
    projections without OpenMP, it writes the library `cc` makes of that command, from a checked compile of it
    (compiled again only when its inputs change) rather than 10 s of compiling every run."""
    source, flags = SOURCE_DIR / "matmul_rows.c", flags_for(host_tier())
    prebuilt = start_checked_compile("cc", flags, [source], tmp_path / "matmul_rows.so")
    status, errors = prebuilt.wait()
    assert status == 0, errors
    expected = [*flags, str(source), "-lm"]  # build.py's command, less its -o
    script = tmp_path / "cc-no-openmp"
    script.write_text(f"""#!{sys.executable}
import shutil, subprocess, sys
args = sys.argv[1:]
with open({str(calls)!r}, "a") as log:
    log.write(" ".join(args) + "\\n")
if "-fopenmp" in args:
    sys.exit(1)
at = args.index("-o") if "-o" in args else -1
if at >= 0 and args[:at] + args[at + 2:] == {expected!r}:
    shutil.copyfile({str(prebuilt.output)!r}, args[at + 1])
    sys.exit(0)
sys.exit(subprocess.call(["cc", *args]))
""")
    script.chmod(0o755)
    return script


def test_a_compiler_without_openmp_builds_single_threaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A compiler that rejects -fopenmp (clang without libomp, say) still gives working kernels, one thread."""
    calls = tmp_path / "calls"
    monkeypatch.setenv("CC", str(compiler_without_openmp(tmp_path, calls)))
    with caplog.at_level(logging.WARNING):
        matmul = NativeMatmul(cache_dir=tmp_path / "cache")
    builds = [line for line in calls.read_text().splitlines() if "-o " in line]  # not the --version probe
    assert ["-fopenmp" in line for line in builds] == [True, False] and "without OpenMP" in caplog.text
    x, w = np.ones((3, 16), np.float32), np.arange(16 * 9, dtype=np.float32).reshape(9, 16)
    assert not matmul.threaded and np.array_equal(matmul.project(x, w), x @ w.T)


def test_the_default_build_is_threaded(cache_dir: Path) -> None:
    """With gcc (CI's and this machine's compiler) the kernels are built with OpenMP."""
    require_gcc()  # CI=true: a failure when missing
    assert NativeMatmul(cache_dir=cache_dir, max_rows=4).threaded


def test_a_library_that_will_not_load_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache on a noexec mount, say: ctypes raises OSError; "auto" keeps what does load."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("failed to map segment from shared object")

    monkeypatch.setattr("backends.numpy_backend.kernel_choice.NativeMatmul", refuse)
    kernels = choose_kernels("auto", *model_of(64))
    assert kernels.project is numpy_project and kernels.fused_step is not None
    assert getattr(kernels.decode_attention, "__self__", None).__class__ is NativeAttention
    with pytest.raises(BackendError, match="did not build or load"):
        choose_kernels("native", *model_of(64))


def test_backend_choice(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    reference = choose_kernels("numpy", *model_of(64))
    assert reference.decode_attention is decode_attention and reference.project is numpy_project
    assert reference.fused_step is None
    native = choose_kernels("native", *model_of(64))
    assert getattr(native.decode_attention, "__self__", None).__class__ is NativeAttention
    assert getattr(native.project, "__self__", None).__class__ is NativeMatmul
    assert isinstance(native.fused_step, NativeFusedStep) and isinstance(native.row_sampler, NativeSampler)
    assert reference.row_sampler is None
    shape_not_done = choose_kernels("auto", *model_of(12))  # attention and the fused step do not do it; matmul does
    assert shape_not_done.decode_attention is decode_attention and shape_not_done.project is not numpy_project
    assert shape_not_done.fused_step is None
    with pytest.raises(BackendError, match="does not support"):
        choose_kernels("native", *model_of(12))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached there: it must compile, and cannot
    with caplog.at_level(logging.WARNING):
        assert choose_kernels("auto", *model_of(64)) == reference
    for what in ("attention", "projection", "fused step", "sampler"):
        assert f"C {what} kernel unavailable" in caplog.text
    with pytest.raises(BackendError, match="did not build"):
        choose_kernels("native", *model_of(64))
