"""Decode steps replayed from CUDA graphs on the emulated device (emu_graphs.py: a capture records the launches and
array calls without running them, a replay runs the record), against a twin CupyBackend on its own emulated device
running every step eagerly, both fed the same batches.

Checked: which steps replay (pure decode) and which stay eager (prefill, mixed); the buckets each mode captures
and when; that a replay computes the step copied into the static buffers (a replay of stale buffers gives the
old step's logits, not the new one's); that a padded row writes no KV slot (every slot outside the step's is
unchanged, bit for bit, and the whole pool matches the eager twin's); sampling in the graph (greedy and random)
and the eager sampler after a graph's forward (top-p). The same on the tiny Gemma 3 (tiny_model.py), whose
sliding layers' decode attention reads only their window of the prefilled contexts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from backends.base import SamplingInputs, StepBatch
from backends.cupy_backend.backend import CupyBackend
from backends.cupy_backend.graphs import GraphSettings
from backends.cupy_backend.quant_weights import stored_types
from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from backends.model.weights import StoredTypes
from tests.cupy_backend.emu_device import emu_device
from tests.cupy_backend.emu_graphs import TapeGraphs
from tests.cupy_backend.tiny_model import write_tiny_gemma3_d256, write_tiny_llama_d64_quant

BLOCK_SIZE, NUM_BLOCKS, PARTITION_SIZE = 8, 40, 32
GRAPH_MAX = 4  # buckets 1, 2, 4
# The same kernels on the same device either way: the replay differs from the eager step only in the rows a GEMM
# multiplies at once (the bucket's, padding included), which may move float32 sums by their rounding (measured
# here: identical, float32 and bfloat16).
LOGIT_ATOL = {"float32": 1e-4, "bfloat16": 0.05}
LOGPROB_ATOL = {"float32": 1e-4, "bfloat16": 0.05}


@dataclass
class Twins:
    graphed: CupyBackend
    eager: CupyBackend
    tapes: TapeGraphs
    dtype: str

    def execute(self, batch: StepBatch) -> None:
        got, want = self.graphed.execute(batch), self.eager.execute(batch)
        assert got.token_ids.tolist() == want.token_ids.tolist() or self.dtype != "float32", "tokens differ"
        if want.logprobs is not None:
            assert got.logprobs is not None
            err = float(np.abs(got.logprobs - want.logprobs).max())
            assert err <= LOGPROB_ATOL[self.dtype], f"logprobs differ by {err:.3g}"

    def replays(self, batch: StepBatch) -> int:
        """Runs the step on both; how many graph replays it took."""
        before = self.tapes.replays
        self.execute(batch)
        return self.tapes.replays - before


def make_twins(library: Path, model_path: Path, dtype: str, mode: str, stored: StoredTypes = (),
               max_batch: int = GRAPH_MAX, num_blocks: int = NUM_BLOCKS) -> Twins:
    model = load_model(model_path, stored)
    device, _ = emu_device(library)
    eager_device, _ = emu_device(library)
    graphed = CupyBackend(model.config, model.weights, device, dtype=dtype, partition_size=PARTITION_SIZE,
                          graphs=GraphSettings(mode, max_batch))
    eager = CupyBackend(model.config, model.weights, eager_device, dtype=dtype, partition_size=PARTITION_SIZE)
    for backend in (graphed, eager):
        backend.init_cache(num_blocks, BLOCK_SIZE)
    assert isinstance(device.graphs, TapeGraphs)
    return Twins(graphed, eager, device.graphs, dtype)


def prefilled(twins: Twins, count: int, seed: int, blocks_each: int = 9, prompt_len: int = 33) -> list[SeqState]:
    """`count` sequences over disjoint shuffled blocks (block 0 unused), prefilled (by default past one
    partition)."""
    rng = np.random.default_rng(seed)
    order = [int(b) for b in rng.permutation(np.arange(1, twins.graphed.cache.num_blocks))]
    seqs = [SeqState(blocks=order[i * blocks_each : (i + 1) * blocks_each]) for i in range(count)]
    prompts = [[int(t) for t in rng.integers(3, 32, prompt_len + 2 * i)] for i in range(count)]
    assert twins.replays(make_batch(seqs, prompts, BLOCK_SIZE)) == 0, "a prefill step replayed a graph"
    return seqs


def decode(seqs: list[SeqState], seed: int, sampling: SamplingInputs | None = None) -> StepBatch:
    tokens = np.random.default_rng(seed).integers(3, 32, len(seqs))
    batch = make_batch(seqs, [[int(t)] for t in tokens], BLOCK_SIZE)
    assert batch.sampling is not None
    params = sampling if sampling is not None else batch.sampling
    return replace(batch, sampling=replace(params, want_logprobs=True))


def random_sampling(n: int, top_p: float) -> SamplingInputs:
    return SamplingInputs(temperature=np.full(n, 0.8, np.float32), top_k=np.zeros(n, np.int32),
                          top_p=np.full(n, top_p, np.float32), min_p=np.full(n, 0.05, np.float32),
                          uniforms=np.linspace(0.1, 0.9, n).astype(np.float32))


def check_modes(library: Path, model_path: Path) -> None:
    """off never captures; lazy captures a bucket at its first step (forward and sampling graphs); eager
    captures every bucket in init_cache."""
    off = make_twins(library, model_path, "float32", "off")
    assert off.graphed.graphs is None and off.replays(decode(prefilled(off, 3, 1), 2)) == 0
    assert off.tapes.captures == 0
    lazy = make_twins(library, model_path, "float32", "lazy")
    seqs = prefilled(lazy, 3, 1)
    assert lazy.tapes.captures == 0
    assert lazy.replays(decode(seqs, 2)) == 2 and lazy.tapes.captures == 2
    assert lazy.replays(decode(seqs[:1], 3)) == 2 and lazy.tapes.captures == 4
    assert lazy.replays(decode(seqs, 4)) == 2 and lazy.tapes.captures == 4
    assert lazy.graphed.graphs is not None and sorted(lazy.graphed.graphs.graphs) == [1, 4]
    eager = make_twins(library, model_path, "float32", "eager")
    assert eager.graphed.graphs is not None and sorted(eager.graphed.graphs.graphs) == [1, 2, 4]
    assert eager.tapes.captures == 6
    print("modes: off 0 captures, lazy 2 per bucket at first use, eager 6 at init_cache")


def check_replay_reads_static_inputs(twins: Twins, seqs: list[SeqState]) -> None:
    """Step X through the bucket's graph, then step Y (same sequences and positions, other tokens): a replay
    without refreshing the static buffers gives X's logits, not Y's; with them, Y's."""
    assert twins.graphed.graphs is not None
    graphs, lengths = twins.graphed.graphs, [len(s.tokens) for s in seqs]
    x = decode(seqs, 10)
    for seq, n in zip(seqs, lengths, strict=True):
        del seq.tokens[n:]
    y = decode(seqs, 11)
    want_x, want_y = twins.eager.compute_logits(x), twins.eager.compute_logits(y)
    tol = LOGIT_ATOL[twins.dtype]
    assert float(np.abs(want_x - want_y).max()) > 20 * tol, "the two steps' logits are too alike to tell apart"
    got_x = np.array(twins.graphed.graph_logits(x, 4))
    stale = graphs.graphs[4]
    twins.tapes.replay(stale.forward)
    got_stale = np.array(stale.logits[: len(seqs)])
    got_y = np.array(twins.graphed.graph_logits(y, 4))
    err = max(float(np.abs(got_x - want_x).max()), float(np.abs(got_y - want_y).max()))
    assert err <= tol, f"replay and eager logits differ by {err:.3g}"
    assert np.abs(got_stale - want_x).max() <= tol, "a stale replay computed something other than the old step"
    off = float(np.abs(got_stale - want_y).max())
    assert off > 10 * tol, "a replay of stale buffers computed the new step"
    print(f"static inputs: replays of X and Y within {err:.3g} of eager; a stale replay gives X's (off Y's by "
          f"{off:.3g})")


def check_padding_writes_no_kv(twins: Twins, seqs: list[SeqState]) -> None:
    """A step of fewer sequences than its bucket (3 in bucket 4, 11 in 16): only the step's slots change in the
    graphed pool, no slot outside the sequences' tokens was ever written, and both pools agree."""
    before = twins.graphed.cache.data.copy()
    batch = decode(seqs, 12)
    assert twins.replays(batch) == 2
    after = twins.graphed.cache.data
    changed = slot_written(before != after)
    assert set(np.flatnonzero(changed).tolist()) <= set(batch.slot_mapping.tolist()), "a padded row wrote KV"
    assert changed[batch.slot_mapping].all(), "the step's own K/V were not written"
    owned = {slot for seq in seqs for slot in seq.slots(0, len(seq.tokens), BLOCK_SIZE)}
    written = slot_written(after)
    assert set(np.flatnonzero(written).tolist()) <= owned, "a slot of no sequence (a padded row's) was written"
    err = float(np.abs(after.astype(np.float32) - twins.eager.cache.data.astype(np.float32)).max())
    assert err <= LOGIT_ATOL[twins.dtype], f"KV pools differ by {err:.3g}"
    print(f"padding: only the step's {len(batch.slot_mapping)} slots changed; pools within {err:.3g}")


def slot_written(pool: np.ndarray) -> np.ndarray:
    """(slots,) bool: whether any layer's K or V in the slot is nonzero (the pool starts zeroed)."""
    return (pool != 0).reshape(*pool.shape[:2], pool.shape[2] * pool.shape[3], -1).any(axis=(0, 1, 3))


def graphs_scenario(library: Path, model_path: Path) -> None:
    check_modes(library, model_path)
    twins = make_twins(library, model_path, "float32", "lazy")
    seqs = prefilled(twins, 3, 5)
    check_replay_reads_static_inputs(twins, seqs)
    check_padding_writes_no_kv(twins, seqs)
    assert twins.replays(decode(seqs, 13, random_sampling(3, 1.0))) == 2, "random sampling left the graph"
    assert twins.replays(decode(seqs, 14, random_sampling(3, 0.9))) == 1, "top-p sampled inside the graph"
    spare = min(set(range(1, NUM_BLOCKS)) - {b for seq in seqs for b in seq.blocks})
    mixed = make_batch([*seqs, SeqState(blocks=[spare])], [[5], [6], [7], [8, 9, 10]], BLOCK_SIZE)
    assert twins.replays(mixed) == 0, "a mixed step replayed a graph"
    assert twins.replays(decode(seqs[:2], 15)) == 2
    assert twins.graphed.graphs is not None and sorted(twins.graphed.graphs.graphs) == [2, 4]
    kernels = set(twins.tapes.tapes[0].kernels)
    assert {"paged_attention_decode_partitioned_f32_d64", "paged_attention_reduce_f32_d64",
            "rope_and_cache_f32"} <= kernels and "paged_prefill_attention_f32_d64" not in kernels
    print(f"graphs float32: {twins.tapes.captures} captures, {twins.tapes.replays} replays")


def quant_graphs_scenario(library: Path, model_path: Path) -> None:
    """The quantized tiny model in bfloat16: the dequantizing GEMV, the embedding rows and the widening bf16
    GEMM of the head inside the graph, replayed against the eager twin."""
    path = write_tiny_llama_d64_quant(model_path.with_name("tiny-d64-quant-graphs.gguf"))
    twins = make_twins(library, path, "bfloat16", "lazy", stored_types())
    seqs = prefilled(twins, 3, 6)
    check_replay_reads_static_inputs(twins, seqs)
    check_padding_writes_no_kv(twins, seqs)
    for seed in (20, 21):
        assert twins.replays(decode(seqs, seed)) == 2
    kernels = set(twins.tapes.tapes[0].kernels)
    assert {"quant_gemv_q4_1_bf16", "dequantize_q8_0_bf16", "quant_gemv_logits_q8_0_bf16"} <= kernels, kernels
    print(f"graphs quant bfloat16: {twins.tapes.captures} captures, {twins.tapes.replays} replays")


def quant_gemm_graphs_scenario(library: Path, model_path: Path) -> None:
    """The quantized tiny model in bfloat16 with 11 sequences in bucket 16: past the GEMV's 8 rows, the
    dequantizing GEMM inside the graph (5 of its rows padding), replayed against the eager twin."""
    path = write_tiny_llama_d64_quant(model_path.with_name("tiny-d64-quant-gemm-graphs.gguf"))
    twins = make_twins(library, path, "bfloat16", "lazy", stored_types(), max_batch=16, num_blocks=60)
    seqs = prefilled(twins, 11, 7, blocks_each=5, prompt_len=17)
    check_padding_writes_no_kv(twins, seqs)
    for seed in (25, 26):
        assert twins.replays(decode(seqs, seed)) == 2
    kernels = set(twins.tapes.tapes[0].kernels)
    assert {"quant_gemm_q4_1_bf16", "quant_gemm_q4_0_bf16", "quant_gemm_logits_q8_0_bf16"} <= kernels, kernels
    assert not any(name.startswith("quant_gemv") for name in kernels), kernels
    print(f"graphs quant GEMM bfloat16: {twins.tapes.captures} captures, {twins.tapes.replays} replays")


def gemma3_graphs_scenario(library: Path, model_path: Path) -> None:
    """The tiny Gemma 3 in float32: QK norm, RoPE over halves with two bases, GeGLU, sandwich norms and the sliding
    layers' windowed decode (the plain kernel over a window of 16; the global layer's partitioned one over the
    whole context) inside the graph, replayed against the eager twin."""
    path = write_tiny_gemma3_d256(model_path.with_name("tiny-gemma3-graphs.gguf"))
    twins = make_twins(library, path, "float32", "lazy")
    seqs = prefilled(twins, 3, 7)  # contexts past the window and past one partition
    check_replay_reads_static_inputs(twins, seqs)
    check_padding_writes_no_kv(twins, seqs)
    for seed in (22, 23):
        assert twins.replays(decode(seqs, seed)) == 2
    assert twins.replays(decode(seqs[:1], 24)) == 2
    kernels = set(twins.tapes.tapes[0].kernels)
    assert {"head_rms_norm_f32", "gelu_tanh_mul_f32", "paged_attention_decode_f32_d256",
            "paged_attention_decode_partitioned_f32_d256", "paged_attention_reduce_f32_d256"} <= kernels, kernels
    print(f"graphs gemma3 float32: {twins.tapes.captures} captures, {twins.tapes.replays} replays")
