"""Roofline cost of one engine step: max(memory time, compute time) + a fixed per-step overhead.

Memory: every step streams all the weights once, reads each sequence's whole KV context and writes the new
tokens' KV. Compute: 2 FLOPs per weight per token through the layers, the output projection only for the rows
that are sampled (backends project just those), plus attention (QK^T and PV: 4 x layers x heads x head_dim
FLOPs per query token per context token). So decode is memory-bound and a long prefill compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import StepBatch
from backends.model.config import ModelConfig
from backends.sim_backend.profiles import HardwareProfile
from backends.step_shape import CostCoefficients, ModelShape, StepShape


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

    def coefficients(self) -> CostCoefficients:
        """This roofline as a linear model (memory and compute added): the scheduler's first guess."""
        p = self.profile
        return CostCoefficients.roofline(self.shape, self.weight_bytes, self.kv_bytes_per_token,
                                         p.effective_bandwidth, p.effective_flops, p.overhead_s)

    def step_cost(self, batch: StepBatch) -> StepCost:
        return self.cost(batch.shape())

    def cost(self, work: StepShape) -> StepCost:
        if work.num_tokens == 0 or self.profile.is_free:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        memory = self.weight_bytes + (work.context_tokens + work.num_tokens) * self.kv_bytes_per_token
        flops = (2 * self.shape.layer_params * work.num_tokens + 2 * self.shape.head_params * work.num_sampled
                 + self.shape.attention_flops_per_context * work.attention_pairs)
        p = self.profile
        return StepCost(float(memory), float(flops), memory / p.effective_bandwidth,
                        flops / p.effective_flops, p.overhead_s)
