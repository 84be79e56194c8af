"""Roofline cost of one engine step: max(memory time, compute time) + a fixed per-step overhead.

Memory: every step streams all the weights once, reads each sequence's whole KV context and writes the new
tokens' KV. Compute: 2 FLOPs per weight per token through the layers, the output projection only for the rows
that are sampled (backends project just those), plus attention (QK^T and PV: 4 x layers x heads x head_dim
FLOPs per query token per context token). So decode is memory-bound and a long prefill compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.base import StepBatch
from backends.model.config import ModelConfig
from backends.sim_backend.profiles import HardwareProfile


@dataclass(frozen=True)
class ModelShape:
    """The sizes the cost model needs, derived from a Llama ModelConfig."""

    layer_params: int  # weights every token goes through: decoder layers (matrices, norms) + final norm
    head_params: int  # the output projection (vocab x hidden), applied to sampled rows only
    kv_elements_per_token: int  # K and V, all layers
    attention_flops_per_context: int  # per query token per context token

    @property
    def streamed_params(self) -> int:
        """Weights read each step. The embedding lookup touches only this step's rows, so a tied or untied
        embedding table adds nothing; with tied embeddings this is the model's parameter count."""
        return self.layer_params + self.head_params

    @classmethod
    def of(cls, cfg: ModelConfig) -> ModelShape:
        attention = cfg.hidden_size * (2 * cfg.q_size + 2 * cfg.kv_size)  # q, k, v, o projections
        mlp = 3 * cfg.hidden_size * cfg.intermediate_size  # gate, up, down
        layer = attention + mlp + 2 * cfg.hidden_size
        return cls(
            layer_params=cfg.num_layers * layer + cfg.hidden_size,
            head_params=cfg.vocab_size * cfg.hidden_size,
            kv_elements_per_token=2 * cfg.num_layers * cfg.kv_size,
            attention_flops_per_context=4 * cfg.num_layers * cfg.num_heads * cfg.head_dim,
        )


@dataclass(frozen=True)
class StepWork:
    """What one step does, independent of the hardware."""

    num_tokens: int
    num_sampled: int
    context_tokens: int  # sum of context_lens: KV tokens read
    attention_pairs: int  # sum over query tokens of the context each attends to

    @classmethod
    def of(cls, batch: StepBatch) -> StepWork:
        q = np.diff(batch.query_start).astype(np.int64)
        ctx = batch.context_lens.astype(np.int64)
        # a chunk's j-th query (0-based from its end) sees ctx - j tokens: sum = q*ctx - q(q-1)/2
        pairs = int((q * ctx - q * (q - 1) // 2).sum())
        return cls(batch.num_tokens, int(batch.sample_rows.shape[0]), int(ctx.sum()), pairs)


@dataclass(frozen=True)
class StepCost:
    memory_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    overhead_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def memory_bound(self) -> bool:
        return self.memory_s >= self.compute_s


class CostModel:
    def __init__(self, config: ModelConfig, profile: HardwareProfile) -> None:
        self.shape = ModelShape.of(config)
        self.profile = profile

    @property
    def weight_bytes(self) -> int:
        return self.shape.streamed_params * self.profile.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.shape.kv_elements_per_token * self.profile.dtype_bytes

    def step_cost(self, batch: StepBatch) -> StepCost:
        return self.cost(StepWork.of(batch))

    def cost(self, work: StepWork) -> StepCost:
        if work.num_tokens == 0 or self.profile.is_free:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        memory = self.weight_bytes + (work.context_tokens + work.num_tokens) * self.kv_bytes_per_token
        flops = (2 * self.shape.layer_params * work.num_tokens + 2 * self.shape.head_params * work.num_sampled
                 + self.shape.attention_flops_per_context * work.attention_pairs)
        p = self.profile
        return StepCost(float(memory), float(flops), memory / p.effective_bandwidth,
                        flops / p.effective_flops, p.overhead_s)
