"""Q8_0 and Q5_0 regrouped 16 rows at a time for the fast precision's AVX-512 VNNI kernel (grouped_q8.py,
q8_grouped.h): the values stay gguf's, the projections are the stored matrix's bit for bit on every path (8-bit x
from one row to any, Q8_0 on the AMX tiles past 32 rows), only the fast precision on the tiers with the kernel
regroups, the stored copy is freed, and the C kernels refuse a regrouped matrix anywhere else."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from backends.model.quant import QuantMatrix
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import CpuTier
from backends.numpy_backend.native.fused_step import NativeFusedStep
from backends.numpy_backend.native.grouped_q8 import (
    LAYOUTS,
    GroupedMatrix,
    group,
    group_weights,
    groupable,
    stored_rows,
)
from backends.numpy_backend.native.matmul import NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from tests.backends.tiers import GROUPED_Q8, RUNNABLE
from tests.backends.tiny_gguf import TinyShape, write_tiny_gemma3
from tests.required import hardware_absent

pytestmark = pytest.mark.usefixtures("c_compiler")
Matmul = Callable[[CpuTier, bool], NativeMatmul]
# rows of x: the 8-bit groups (1-7), x in lanes (8+), past a tile (17), the tiles on amx (33+), past a chunk of 8
ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 64)
SHAPES = ((96, 160), (48, 64), (32, 576))  # (out, in): widths of 5, 2 and 18 blocks, none a super-block multiple


GROUPED_TYPES = (Q.Q8_0, Q.Q5_0)


def stored(rows: int, cols: int, seed: int = 0, qtype: Q = Q.Q8_0) -> QuantMatrix:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return QuantMatrix.quantize(values, qtype)


def grouped_tiers() -> list[CpuTier | str]:
    tiers: list[CpuTier | str] = [t for t in RUNNABLE if t.name in GROUPED_Q8]
    return tiers or ["no AVX-512 VNNI on this machine"]


@pytest.mark.parametrize("qtype", GROUPED_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_regrouping_keeps_every_value_and_every_byte(rows: int, cols: int, qtype: Q) -> None:
    matrix = stored(rows, cols, qtype=qtype)
    grouped = group(matrix)
    assert grouped.shape == matrix.shape and grouped.nbytes == matrix.nbytes
    assert not np.array_equal(grouped.data, matrix.data)  # the bytes moved
    np.testing.assert_array_equal(grouped.dequantize(), matrix.dequantize())
    ids = np.array([rows - 1, 0, 17, 17, 5])
    np.testing.assert_array_equal(grouped.rows(ids), matrix.rows(ids))
    np.testing.assert_array_equal(stored_rows(grouped.data, np.arange(rows), cols, LAYOUTS[qtype]), matrix.data)


def test_only_whole_groups_of_stored_q8_0_are_regrouped() -> None:
    assert groupable(stored(32, 64))
    assert not groupable(stored(40, 64))  # 40 rows: not whole groups of 16
    assert groupable(stored(32, 64, qtype=Q.Q5_0))
    assert not groupable(QuantMatrix.quantize(np.ones((32, 64), np.float32), Q.Q4_0))
    assert not groupable(group(stored(32, 64)))  # once
    assert not groupable(np.ones((32, 64), np.float32))


def test_each_tier_reports_the_grouped_kernel_it_should(matmul_for: Matmul, tier: CpuTier) -> None:
    assert matmul_for(tier, True).groups_q8 == (tier.name in GROUPED_Q8)
    assert not matmul_for(tier, False).groups_q8  # the exact precision never regroups


@pytest.mark.parametrize("tier", grouped_tiers(), ids=lambda t: getattr(t, "name", "absent"))
@pytest.mark.parametrize("qtype", GROUPED_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_a_grouped_projection_is_the_stored_ones_bit_for_bit(matmul_for: Matmul, tier: CpuTier | str, rows: int,
                                                             cols: int, qtype: Q) -> None:
    """Every step size through the C kernels: the 8-bit groups, x in lanes, and on amx the tiles (the groups as
    their second operand, x as the first, where the stored rows are the first); 100 rows past the stored path's
    own limit where the tiles take Q8_0 at any."""
    if isinstance(tier, str):
        hardware_absent(tier)
    fast = matmul_for(tier, True)
    matrix = stored(rows, cols, seed=rows, qtype=qtype)
    grouped = group(matrix)
    rng = np.random.default_rng(cols)
    for m in (*ROWS, *((100,) if fast.fast_uses_tiles and qtype == Q.Q8_0 else ())):  # stored Q5_0: BLAS past 64
        x = rng.standard_normal((m, cols)).astype(np.float32)
        expected = fast.project(x, matrix)
        np.testing.assert_array_equal(fast.project(x, grouped), expected, err_msg=f"{m} rows")
        reference = x @ matrix.dequantize().T
        assert np.abs(expected - reference).max() < 0.02 * np.abs(reference).max()  # 8-bit x: ~0.5 %


@pytest.mark.parametrize("tier", grouped_tiers(), ids=lambda t: getattr(t, "name", "absent"))
def test_the_exact_kernels_refuse_a_grouped_matrix(matmul_for: Matmul, tier: CpuTier | str) -> None:
    """Its rows are not rows of blocks: any kernel but the grouped one would read wrong values, so the C entry
    refuses it, and the float32 copy for BLAS comes from its own dequantization."""
    if isinstance(tier, str):
        hardware_absent(tier)
    grouped, x = group(stored(32, 64)), np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="status -2"):
        matmul_for(tier, False).project(x, grouped)
    np.testing.assert_array_equal(matmul_for(tier, True).dense(grouped), grouped.dequantize())


@pytest.fixture(scope="module", params=GROUPED_TYPES, ids=lambda q: q.name)
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """One grouped type everywhere, and every matrix's rows whole groups of 16 (a 32-token vocabulary, the tied
    head)."""
    shape = TinyShape(layers=3, heads=4, kv_heads=1, head_size=32, sliding_window=8)
    return write_tiny_gemma3(tmp_path_factory.mktemp("grouped") / "tiny.gguf", request.param, seed=3, shape=shape)


def step_logits(backend: NumpyBackend, prompts: list[list[int]]) -> np.ndarray:
    """A prompt chunk per sequence, then a decode step of all of them: both steps' logits."""
    backend.init_cache(8 * len(prompts), 16)
    seqs = [SeqState(blocks=[2 * i, 2 * i + 1]) for i in range(len(prompts))]
    prefill = backend.compute_logits(make_batch(seqs, prompts, 16))
    for seq, prompt in zip(seqs, prompts, strict=True):
        seq.tokens = list(prompt)
    return np.concatenate([prefill, backend.compute_logits(make_batch(seqs, [[5]] * len(prompts), 16))])


def test_the_backend_regroups_in_the_fast_precision_only(tiny_gemma: Path) -> None:
    """On a tier with the kernel, the fast backend's Q8_0 matrices are regrouped (the tied head and embedding
    one matrix still) and its steps' logits are those of the same backend with the stored matrices, bit for
    bit, for steps that take the 8-bit path and, of 40 rows, the tiles on amx; the exact one keeps them stored."""
    model = load_model(str(tiny_gemma), stored=STORED_TYPES)
    fast = NumpyBackend(model, "native", "fast")
    if not NativeMatmul(fast=True, tier=fast.cpu_tier).groups_q8:
        hardware_absent(f"no grouped Q8_0 kernel on tier {fast.cpu_tier}")
    weights = fast.model.weights
    assert isinstance(weights.lm_head, GroupedMatrix) and weights.embedding is weights.lm_head
    assert all(isinstance(layer.wqkv, GroupedMatrix) for layer in weights.layers)
    assert type(NumpyBackend(model, "native", "exact").model.weights.lm_head) is QuantMatrix
    as_stored = NumpyBackend(model, "native", "fast", group_q8=False)
    assert type(as_stored.model.weights.lm_head) is QuantMatrix
    forty = [[(5 * i + j) % 28 + 3 for j in range(5)] for i in range(8)]  # a 40-row prefill: the tiles on amx
    for prompts in ([[3, 9, 4]], [[3, 9], [7, 1, 2], [4]], forty):
        np.testing.assert_array_equal(step_logits(fast, prompts), step_logits(as_stored, prompts))


def test_the_exact_fused_step_refuses_grouped_weights(tiny_gemma: Path) -> None:
    """The fused C step in exact reads rows of blocks: handed regrouped layers, it refuses the step."""
    model = load_model(str(tiny_gemma), stored=STORED_TYPES)
    backend = NumpyBackend(model, "native", "exact")
    if not NativeMatmul(fast=True, tier=backend.cpu_tier).groups_q8:
        hardware_absent(f"no grouped Q8_0 kernel on tier {backend.cpu_tier}")
    backend.forward.fused_step = NativeFusedStep(model.config, group_weights(model.weights), fast=False,
                                                 tier=backend.cpu_tier)
    with pytest.raises(ValueError, match="native fused step"):
        step_logits(backend, [[3, 9, 4]])


def test_the_stored_matrices_are_freed(tiny_gemma: Path) -> None:
    """Regrouping makes new arrays: the backend keeps no reference to the stored ones, so a server's resident
    memory holds the model once."""
    model = load_model(str(tiny_gemma), stored=STORED_TYPES)
    head = weakref.ref(model.weights.lm_head.data)
    backend = NumpyBackend(model, "native", "fast")
    if not isinstance(backend.model.weights.lm_head, GroupedMatrix):
        hardware_absent(f"no grouped Q8_0 kernel on tier {backend.cpu_tier}")
    del model
    gc.collect()
    assert head() is None

