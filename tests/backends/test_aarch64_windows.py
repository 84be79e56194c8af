"""A sliding layer's attention (a query sees the last `window` positions) in the AArch64 builds, under qemu-user
as test_aarch64_kernels.py runs the whole-context cases: decode and prefill chunks on both ARM tiers against the
float64 references with the window, within bounds.attention_bound over the keys a query sees."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest

from backends.numpy_backend.attention import decode_attention, prefill_attention
from tests.backends.aarch64.cross import Batch, Call, Kernels, build_all, require_tools
from tests.backends.bounds import assert_within, attention_bound
from tests.backends.test_aarch64_kernels import TIERS, Calls, Chunk, Decode, Key, chunk_case, decode_case, run_batch

# Gemma 3's heads (4 of 256 over 1) and another shape; windows inside a block and across several
DECODE_CASES = [(heads, kv_heads, dim, block_size, window) for heads, kv_heads, dim in [(9, 3, 64), (4, 1, 256)]
                for block_size in (1, 16) for window in (5, 100)]
CHUNK_CASES = [(heads, kv_heads, dim, 16, chunk, context, window) for heads, kv_heads, dim in [(9, 3, 64), (4, 1, 256)]
               for chunk, context in [(7, 7), (33, 290)] for window in (5, 100)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Calls:
    kernels: Kernels = build_all(require_tools())

    def make(kernels: Kernels, batch: Batch) -> Iterable[tuple[Key, Call]]:
        for tier in TIERS:
            build = kernels.builds[tier]
            for heads, kv_heads, dim, block_size, window in DECODE_CASES:
                d = decode_case(heads, kv_heads, dim, block_size)
                yield (tier, "decode", heads, kv_heads, dim, block_size, window), batch.decode(
                    build, d.q, d.k, d.v, d.tables, d.lens, 0, window)
            for *shape, window in CHUNK_CASES:
                c = chunk_case(*shape)
                yield (tier, "chunk", *shape, window), batch.chunk(build, c.q, c.k, c.v, c.table, c.context, 0,
                                                                    window)

    return run_batch(kernels, tmp_path_factory.mktemp("window") / "calls", make)


def decode_reference(case: Decode, window: int) -> tuple[np.ndarray, np.ndarray]:
    q, k, tables = case.q.astype(np.float64), case.k.astype(np.float64), np.maximum(case.tables, 0)
    reference, weighted = (decode_attention(q, k, values.astype(np.float64), tables, case.lens, window)
                           for values in (case.v, np.abs(case.v)))
    return reference, attention_bound(case.q, case.k, weighted, min(window, int(case.lens.max())))


def chunk_reference(case: Chunk, window: int) -> tuple[np.ndarray, np.ndarray]:
    q, k, table = case.q.astype(np.float64), case.k.astype(np.float64), np.maximum(case.table, 0)
    reference, weighted = (prefill_attention(q, k, values.astype(np.float64), table, case.context, window)
                           for values in (case.v, np.abs(case.v)))
    return reference, attention_bound(case.q, case.k, weighted, min(window, case.context))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "window"), DECODE_CASES)
def test_a_sliding_layers_decode(runs: Calls, tier: str, heads: int, kv_heads: int, dim: int, block_size: int,
                                 window: int) -> None:
    out = runs[tier, "decode", heads, kv_heads, dim, block_size, window].result()
    assert_within(out, *decode_reference(decode_case(heads, kv_heads, dim, block_size), window))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "chunk", "context", "window"), CHUNK_CASES)
def test_a_sliding_layers_chunk(runs: Calls, tier: str, heads: int, kv_heads: int, dim: int, block_size: int,
                                chunk: int, context: int, window: int) -> None:
    out = runs[tier, "chunk", heads, kv_heads, dim, block_size, chunk, context, window].result()
    assert_within(out, *chunk_reference(chunk_case(heads, kv_heads, dim, block_size, chunk, context), window))
