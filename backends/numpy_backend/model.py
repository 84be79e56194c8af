"""The decoder forward pass in float32 NumPy over a paged KV cache, computing what the model's Architecture
says (backends/model/architecture.py): Llama's layer, Qwen's QKV biases and QK norms, Llama 3's RoPE frequency
factors, and Gemma 3's norms, GeGLU and sliding windows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import StepBatch
from backends.model.config import ModelConfig
from backends.model.quant import lookup
from backends.model.weights import LayerWeights, ModelWeights
from backends.numpy_backend.attention import (
    AttentionLayout,
    ChunkAttention,
    DecodeAttention,
    decode_attention,
    paged_attention,
    prefill_attention,
)
from backends.numpy_backend.kv_cache import PagedKVCache
from backends.numpy_backend.layers import ACTIVATIONS, RopeTable, rms_norm, rotate, rotate_halves
from backends.numpy_backend.native.fused_step import NativeFusedStep
from backends.numpy_backend.native.matmul import Projection, numpy_project


@dataclass(frozen=True)
class StepContext:
    """What every layer of a step shares: which rows are decode tokens, and each token's RoPE angles (cos, sin)
    for each RoPE base the layers use."""

    layout: AttentionLayout
    angles: dict[float, tuple[np.ndarray, np.ndarray]]


class DecoderForward:
    def __init__(self, config: ModelConfig, weights: ModelWeights,
                 decode_attention: DecodeAttention = decode_attention, project: Projection = numpy_project,
                 fused_step: NativeFusedStep | None = None, chunk_attention: ChunkAttention = prefill_attention
                 ) -> None:
        self.config = config
        self.weights = weights
        self.decode_attention = decode_attention
        self.chunk_attention = chunk_attention  # a prefill chunk's attention, one sequence at a time
        self.project = project  # x @ w.T, for every weight matrix
        self.fused_step = fused_step  # every layer of a small step in one C call, when built
        self.ropes = {base: RopeTable.build(config.head_dim, base, config.context_length, factors)
                      for base, factors in config.rope_bases().items()}
        self.rotate = rotate_halves if config.arch.rope_pairs == "halves" else rotate
        self.activation = ACTIVATIONS[config.arch.activation]

    def hidden_states(self, batch: StepBatch, cache: PagedKVCache) -> np.ndarray:
        """Run every token of the step through all layers (writing their KV); returns (T, hidden)."""
        check_window_inputs(batch, cache)
        x = lookup(self.weights.embedding, batch.token_ids)
        if self.config.arch.scale_embeddings:
            x = x * np.float32(np.sqrt(self.config.hidden_size))
        angles = {base: rope.at(batch.positions) for base, rope in self.ropes.items()}
        step = StepContext(AttentionLayout.of(batch.query_start), angles)
        if self.fused_step is not None and self.fused_step.fits(len(x)):
            self._fused(x, batch, step, cache)
            return x
        for index, layer in enumerate(self.weights.layers):
            x = x + self._normed(layer.post_attn_norm, self._attention(index, layer, x, batch, step, cache))
            x = x + self._normed(layer.post_ffn_norm, self._mlp(layer, x))
        return x

    def _normed(self, weight: np.ndarray | None, x: np.ndarray) -> np.ndarray:
        """x through a sandwich norm where the layer has one."""
        return x if weight is None else rms_norm(x, weight, self.config.rms_eps)

    def _fused(self, x: np.ndarray, batch: StepBatch, step: StepContext, cache: PagedKVCache) -> None:
        """The step in one C call, a row per token: a chunk's tokens take their sequence's block table and
        attend up to their own positions."""
        assert self.fused_step is not None
        tables, window_tables, lengths, seq_first = batch.block_tables, batch.window_tables, batch.context_lens, None
        if not step.layout.all_decode:
            seq_of_token = np.repeat(np.arange(len(tables)), np.diff(batch.query_start))
            tables, lengths = tables[seq_of_token], batch.positions + 1
            window_tables = None if window_tables is None else window_tables[seq_of_token]
            seq_first = _own_rows_for_sampled(batch, batch.query_start[seq_of_token])
        half = self.config.head_dim // 2
        (cos, sin), local = step.angles[self.config.rope_theta], step.angles.get(self.config.arch.local_rope_base)
        local_angles = None if local is None else (local[0].reshape(-1, half), local[1].reshape(-1, half))
        window = None if window_tables is None or batch.window_slots is None else (batch.window_slots, window_tables)
        self.fused_step.run(x, cache, cos.reshape(-1, half), sin.reshape(-1, half), batch.slot_mapping, tables,
                            lengths, seq_first, local_angles, window)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(S, hidden) final hidden states of the rows to sample -> (S, vocab) logits."""
        normed = rms_norm(hidden, self.weights.final_norm, self.config.rms_eps)
        return self.project(normed, self.weights.lm_head)

    def _attention(self, index: int, layer: LayerWeights, x: np.ndarray, batch: StepBatch, step: StepContext,
                   cache: PagedKVCache) -> np.ndarray:
        cfg = self.config
        qkv = self.project(rms_norm(x, layer.attn_norm, cfg.rms_eps), layer.wqkv)
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        heads = cfg.num_heads + cfg.num_kv_heads  # Q and K heads, normed and rotated together
        qk = qkv[:, : cfg.q_size + cfg.kv_size].reshape(-1, heads, cfg.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            qk = rms_norm(qk, self._qk_norm_weights(layer.q_norm, layer.k_norm), cfg.rms_eps)
        qk = self.rotate(qk, *step.angles[cfg.layer_rope_base(index)])
        q, k = qk[:, : cfg.num_heads], qk[:, cfg.num_heads :]
        v = qkv[:, cfg.q_size + cfg.kv_size :].reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        slots, tables = _kv_refs(index, batch, cache)
        cache.write(index, slots, k, v)  # before attention: a chunk attends to its own keys
        out = paged_attention(q, cache.keys[index], cache.values[index], step.layout, batch.query_start,
                              tables, batch.context_lens, self.decode_attention, self.chunk_attention,
                              cfg.layer_window(index))
        return self.project(out.reshape(-1, cfg.q_size), layer.wo)

    def _qk_norm_weights(self, q_norm: np.ndarray, k_norm: np.ndarray) -> np.ndarray:
        """(heads + kv_heads, head_dim): each Q head's norm weight, then each K head's."""
        cfg = self.config
        return np.concatenate([np.tile(q_norm, (cfg.num_heads, 1)), np.tile(k_norm, (cfg.num_kv_heads, 1))])

    def _mlp(self, layer: LayerWeights, x: np.ndarray) -> np.ndarray:
        h = rms_norm(x, layer.ffn_norm, self.config.rms_eps)
        return self.project(self.activation(self.project(h, layer.w_gate_up)), layer.w_down)


def check_window_inputs(batch: StepBatch, cache: PagedKVCache) -> None:
    """A step brings the window pool's tables and slots exactly when the cache has that pool: a scheduler bug
    otherwise, which would read and write the sliding layers' K/V in the wrong pool."""
    pool = bool(cache.window_layers)
    if (batch.window_tables is not None, batch.window_slots is not None) != (pool, pool):
        have = "has a window pool" if pool else "has no window pool"
        raise ValueError(f"the KV cache {have}, but the step's window_tables and window_slots are "
                         f"{_given(batch.window_tables)} and {_given(batch.window_slots)}")
    if batch.window_block_copies and not pool:
        raise ValueError("window block copies for a KV cache without a window pool")


def _given(array: np.ndarray | None) -> str:
    return "missing" if array is None else "given"


def _kv_refs(index: int, batch: StepBatch, cache: PagedKVCache) -> tuple[np.ndarray, np.ndarray]:
    """The slots and block tables of layer `index`'s K/V: the window pool's where the layer lives there."""
    if index in cache.window_layers:
        assert batch.window_slots is not None and batch.window_tables is not None  # check_window_inputs
        return batch.window_slots, batch.window_tables
    return batch.slot_mapping, batch.block_tables


def _own_rows_for_sampled(batch: StepBatch, seq_first: np.ndarray) -> np.ndarray:
    """Each row's group for attention (the first row of its chunk): a sequence that samples every one of its
    rows (verifying guesses) has each row attend on its own, as a decode row does, so that each guessed
    position's logits are the ones decoding would compute, bit for bit; a chunk's rows attend together."""
    if batch.sample_lag is None:
        return seq_first
    samples = np.bincount(batch.sample_rows, minlength=batch.num_seqs)
    verifying = np.flatnonzero((samples > 1) & (samples == np.diff(batch.query_start)))
    if not verifying.size:
        return seq_first
    own = seq_first.copy()
    for b in verifying.tolist():
        start, end = int(batch.query_start[b]), int(batch.query_start[b + 1])
        own[start:end] = np.arange(start, end, dtype=own.dtype)
    return own

