"""Shared builders for the sim backend tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from backends.base import StepBatch
from backends.config import BackendConfig
from backends.manual_batch import SeqState, greedy, make_batch
from backends.model.config import ModelConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create

BLOCK_SIZE = 16

# The default model's shape (SmolLM2-135M), written out so the cost tests need no model file.
SMOLLM2 = ModelConfig(
    name="smollm2", architecture="llama", num_layers=30, hidden_size=576, intermediate_size=1536,
    num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_eps=1e-5, vocab_size=49152,
    context_length=8192, bos_token_id=1, eos_token_ids=(2,),
)


def backend(files: ModelFiles, profile: str = "zero", clock: str = "virtual", seed: int = 0) -> SimBackend:
    return create(BackendConfig(name="sim", sim_profile=profile, sim_clock=clock, sim_seed=seed), files)


def seqs(n: int, blocks_each: int = 8) -> list[SeqState]:
    return [SeqState(blocks=list(range(i * blocks_each, (i + 1) * blocks_each))) for i in range(n)]


def step(states: Sequence[SeqState], chunks: Sequence[Sequence[int]], sample: bool = True) -> StepBatch:
    return make_batch(states, chunks, BLOCK_SIZE, sample=sample)


def with_sampling(batch: StepBatch, temperature: npt.ArrayLike, uniforms: npt.ArrayLike) -> StepBatch:
    temps = np.asarray(temperature, np.float32)
    sampling = replace(greedy(len(temps)), temperature=temps, uniforms=np.asarray(uniforms, np.float32))
    return replace(batch, sampling=sampling)


def decode_batch(last_tokens: Sequence[int], context_lens: Sequence[int]) -> StepBatch:
    """A decode step of len(last_tokens) sequences, one token each, at the given context lengths."""
    n = len(last_tokens)
    ctx = np.array(context_lens, np.int32)
    return StepBatch(
        seq_ids=tuple(range(n)), token_ids=np.array(last_tokens, np.int32), positions=ctx - 1,
        slot_mapping=np.zeros(n, np.int64), query_start=np.arange(n + 1, dtype=np.int32),
        context_lens=ctx, block_tables=np.zeros((n, 1), np.int32), sample_rows=np.arange(n, dtype=np.int32),
        sampling=greedy(n),
    )
