"""The tiny Gemma 3's sliding layers in a KV pool of their own (init_cache's window_blocks), on the emulated
device: steps bring the window pool's tables and slots (tests/backends/window_pool.py), whose blocks wholly before
a sequence's window are given back (-1 in its table) and drawn again by other sequences, so a kernel that read
outside a window would read another sequence's K/V or no block at all. The logits must match NumpyBackend's with
every layer in one pool, step by step, through prefill chunks and the plain and partitioned decode kernels; then
decode steps replayed from graphs must match the eager twin's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from backends.cupy_backend.backend import CupyBackend
from backends.cupy_backend.graphs import GraphSettings
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from tests.backends.window_pool import WindowPool
from tests.cupy_backend.emu_device import emu_device
from tests.cupy_backend.emu_graph_scenarios import GRAPH_MAX, LOGIT_ATOL
from tests.cupy_backend.emu_graphs import TapeGraphs
from tests.cupy_backend.emu_scenarios import BLOCK_SIZE, NUM_BLOCKS, Pair, make_pair
from tests.cupy_backend.tiny_model import GEMMA3_SHAPE, write_tiny_gemma3_d256

WINDOW_BLOCKS = 12  # three windows of 16 at blocks of 8, beside a step's prompt chunks
# three prompts, a chunk continuing the first past its window beside two decodes, then decodes: contexts to 46
STEPS = [(30, 21, 13), (10, 1, 1)] + [(1, 1, 1)] * 6


def pooled_steps(pair: Pair, pool: WindowPool, rng: np.random.Generator) -> list[SeqState]:
    """Every step on both backends (the window pool's tables for the CuPy backend only), logits compared."""
    order = [int(b) for b in rng.permutation(np.arange(1, NUM_BLOCKS))]
    seqs, minus_ones = [SeqState(blocks=order[7 * i : 7 * (i + 1)]) for i in range(3)], 0
    for i, chunks in enumerate(STEPS):
        batch = make_batch(seqs, [[int(t) for t in rng.integers(3, 32, n)] for n in chunks], BLOCK_SIZE)
        placed = pool.place(batch)
        assert placed.window_tables is not None
        minus_ones += int((placed.window_tables == -1).sum())
        got, want = pair.cupy.compute_logits(placed), pair.numpy.compute_logits(batch)
        err, tol = float(np.abs(got - want).max()), pair.tolerance(want)
        print(f"step {i} {chunks}: max |logit diff| {err:.3g} (tolerance {tol:.3g})", flush=True)
        assert err <= tol, f"step {i}: logits differ by {err:.3g} > {tol:.3g}"
    assert minus_ones > 0 and pool.gave_back > 0 and max(len(s.tokens) for s in seqs) > 2 * GEMMA3_SHAPE.sliding_window
    return seqs


def window_pool_scenario(library: Path, model_path: Path, dtype: str, partition_size: int) -> None:
    path = write_tiny_gemma3_d256(model_path.with_name(f"tiny-gemma3-pool-{dtype}.gguf"))
    pair = make_pair(library, path, dtype, partition_size=partition_size)
    pair.cupy.init_cache(NUM_BLOCKS, BLOCK_SIZE, WINDOW_BLOCKS)
    pool = WindowPool(WINDOW_BLOCKS, BLOCK_SIZE, GEMMA3_SHAPE.sliding_window, seed=1)
    pooled_steps(pair, pool, np.random.default_rng(10))
    short = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    attention = {f"{n}_{short}_d256" for n in ("paged_prefill_attention", "paged_attention_decode_partitioned")}
    assert attention <= set(pair.launcher.names), "a windowed attention path never ran"
    print(f"window pool {dtype}: {pool.gave_back} blocks given back")


def graphs_window_pool_scenario(library: Path, model_path: Path) -> None:
    """Decode steps with the window pool's tables replayed from graphs (float32): the same logits as the eager
    twin's, and the same K/V in both pools."""
    model = load_model(write_tiny_gemma3_d256(model_path.with_name("tiny-gemma3-pool-graphs.gguf")))
    (device, _), (eager_device, _) = emu_device(library), emu_device(library)
    graphed = CupyBackend(model.config, model.weights, device, graphs=GraphSettings("lazy", GRAPH_MAX))
    eager = CupyBackend(model.config, model.weights, eager_device)
    for backend in (graphed, eager):
        backend.init_cache(NUM_BLOCKS, BLOCK_SIZE, WINDOW_BLOCKS)
    assert isinstance(device.graphs, TapeGraphs) and graphed.graphs is not None
    pool, rng = WindowPool(WINDOW_BLOCKS, BLOCK_SIZE, GEMMA3_SHAPE.sliding_window, seed=2), np.random.default_rng(11)
    order = [int(b) for b in rng.permutation(np.arange(1, NUM_BLOCKS))]
    seqs = [SeqState(blocks=order[7 * i : 7 * (i + 1)]) for i in range(3)]
    prompts = pool.place(make_batch(seqs, [[3] * 30, [4] * 21, [5] * 13], BLOCK_SIZE))
    assert graphed.graphs.bucket(prompts) is None
    np.testing.assert_array_equal(graphed.compute_logits(prompts), eager.compute_logits(prompts))
    for step in range(20):
        batch = pool.place(make_batch(seqs, [[int(t)] for t in rng.integers(3, 32, 3)], BLOCK_SIZE))
        assert graphed.graphs.bucket(batch) == 4, f"decode step {step} left the graphs"
        got, want = np.asarray(graphed.graph_logits(batch, 4)), eager.compute_logits(batch)
        assert float(np.abs(got - want).max()) <= LOGIT_ATOL["float32"], f"decode step {step}: logits differ"
    assert device.graphs.replays == 20 and pool.gave_back > 0
    for mine, theirs in ((graphed.cache.data, eager.cache.data), (graphed.cache.window_data, eager.cache.window_data)):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=LOGIT_ATOL["float32"])
    print(f"graphs window pool: 20 decode steps replayed, {pool.gave_back} blocks given back")
