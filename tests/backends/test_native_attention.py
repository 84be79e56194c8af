"""The C decode-attention kernel against its NumPy reference, its build cache, and the backend's choice of it."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from backends.base import BackendError
from backends.numpy_backend.attention import decode_attention
from backends.numpy_backend.kernel_choice import choose_decode_attention
from backends.numpy_backend.native.build import FLAGS, SOURCE_DIR, KernelBuildError, build_library
from backends.numpy_backend.native.kernels import NativeAttention, balanced_runs

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels")


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
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_reference(cache_dir: Path, heads: int, kv_heads: int, dim: int, block_size: int,
                           threads: int) -> None:
    rng = np.random.default_rng(heads * 1000 + dim + block_size)
    lens = [1, 2, block_size, block_size + 1, 7, 100, 257]
    q, k, v, tables, ctx = paged_problem(rng, lens, heads, kv_heads, dim, block_size)
    out = NativeAttention(threads, cache_dir).decode(q, k, v, tables, ctx)
    ref = decode_attention(q, k, v, np.maximum(tables, 0), ctx)
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)


def test_large_scores_do_not_overflow(cache_dir: Path) -> None:
    """exp is taken after subtracting the row max, so scores in the thousands still give a softmax (to the
    float32 conditioning of such scores: a rounding of 1e-4 in a score of 1000 moves its weight by 1e-4)."""
    rng = np.random.default_rng(7)
    q, k, v, tables, ctx = paged_problem(rng, [40, 3], 9, 3, 64, 16)
    out = NativeAttention(1, cache_dir).decode(q * 100, k, v, tables, ctx)
    np.testing.assert_allclose(out, decode_attention(q * 100, k, v, np.maximum(tables, 0), ctx), atol=1e-3)
    assert np.isfinite(out).all()


def test_rejects_what_the_kernel_cannot_do(cache_dir: Path) -> None:
    attention = NativeAttention(1, cache_dir)
    rng = np.random.default_rng(0)
    q, k, v, tables, ctx = paged_problem(rng, [5], 4, 4, 12, 4)
    with pytest.raises(ValueError, match="unsupported"):
        attention.decode(q, k, v, tables, ctx)
    q, k, v, tables, ctx = paged_problem(rng, [5], 4, 4, 16, 4)
    with pytest.raises(ValueError, match="context length"):
        attention.decode(q, k, v, tables, ctx + 100)
    assert not NativeAttention.supports(34, 2, 64) and NativeAttention.supports(32, 8, 128)


@pytest.mark.parametrize(("lens", "parts", "runs"), [
    ([5, 5, 5, 5], 2, [(0, 2), (2, 4)]),
    ([100, 1, 1, 1], 2, [(0, 1), (1, 4)]),
    ([3], 4, [(0, 1)]),
    ([1, 1, 1, 1, 1], 3, [(0, 2), (2, 4), (4, 5)]),
])
def test_balanced_runs_cover_the_batch_once(lens: list[int], parts: int, runs: list[tuple[int, int]]) -> None:
    assert balanced_runs(np.array(lens), parts) == runs


def test_source_compiles_without_warnings(tmp_path: Path) -> None:
    done = subprocess.run(["cc", *FLAGS, "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "x.so"),
                           str(SOURCE_DIR / "paged_attention.c"), "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_build_is_cached_and_keyed_by_source(tmp_path: Path) -> None:
    source = tmp_path / "paged_attention.c"
    source.write_text((SOURCE_DIR / "paged_attention.c").read_text())
    first = build_library(source, tmp_path / "cache")
    mtime = first.stat().st_mtime_ns
    assert build_library(source, tmp_path / "cache") == first and first.stat().st_mtime_ns == mtime
    source.write_text(source.read_text() + "\n/* changed */\n")
    assert build_library(source, tmp_path / "cache") != first


def test_missing_compiler_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(KernelBuildError, match="cannot run"):
        build_library(SOURCE_DIR / "paged_attention.c", tmp_path, compiler="no-such-compiler-here")
    broken = tmp_path / "broken.c"
    broken.write_text("int f( {")
    with pytest.raises(KernelBuildError, match="failed"):
        build_library(broken, tmp_path)
    assert list(tmp_path.glob("*.so")) == []  # no half-written library left behind
    (tmp_path / "file").write_text("")
    with pytest.raises(KernelBuildError, match="cache"):
        build_library(SOURCE_DIR / "paged_attention.c", tmp_path / "file" / "sub")  # unwritable cache


def test_backend_choice(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    assert choose_decode_attention("numpy", 9, 3, 64) is decode_attention
    native = choose_decode_attention("native", 9, 3, 64)
    assert getattr(native, "__self__", None).__class__ is NativeAttention
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached there: it must compile, and cannot
    with caplog.at_level(logging.WARNING):
        assert choose_decode_attention("auto", 9, 3, 64) is decode_attention
    assert "NumPy decode attention" in caplog.text
    with pytest.raises(BackendError, match="did not build"):
        choose_decode_attention("native", 9, 3, 64)
    assert choose_decode_attention("auto", 9, 3, 12) is decode_attention  # a shape the kernel does not do
