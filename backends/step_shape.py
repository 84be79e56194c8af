"""What one engine step does, independent of the hardware, and a linear step-time model over it.

A step's time is, to first order, a fixed part (launching it, and on most machines streaming the weights once)
plus a part per token through the layers, per sampled row through the output head, per KV token read, and per
(query token, context token) pair of attention arithmetic; and, on a backend whose steps take another path
above some number of tokens (the NumPy backend's fused C step ends at 64), a fixed part more for those. The
scheduler fits such a model online to size its prefill chunks (scheduler/step_cost.py); each backend offers a
first guess, which that fit then corrects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from backends.model.config import ModelConfig

FEATURES = ("step", "token", "sampled", "context", "pair", "large")  # CostCoefficients.values(), in order


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
class StepShape:
    """A step's composition: the features of its cost (a StepBatch's is `batch.shape()`: the contract in
    backends/base.py builds on this module, never the other way)."""

    num_tokens: int
    num_sampled: int
    context_tokens: int  # sum of context_lens: KV tokens read
    attention_pairs: int  # sum over query tokens of the context each attends to

    def features(self, large_above: int = 0) -> tuple[float, ...]:
        """The model's inputs, in FEATURES order (the constant first; `large` is 1 for a step of more than
        `large_above` tokens, when that is set)."""
        large = 1.0 if 0 < large_above < self.num_tokens else 0.0
        return 1.0, float(self.num_tokens), float(self.num_sampled), float(self.context_tokens), \
            float(self.attention_pairs), large


@dataclass(frozen=True)
class CostCoefficients:
    """Seconds per step, per token, per sampled row, per KV token read, per attention pair, and per step of
    more than `large_above` tokens (0: no such threshold)."""

    step: float = 0.0
    token: float = 0.0
    sampled: float = 0.0
    context: float = 0.0
    pair: float = 0.0
    large: float = 0.0
    large_above: int = 0

    def __post_init__(self) -> None:
        if any(not (v >= 0.0 and np.isfinite(v)) for v in self.values()) or self.large_above < 0:
            raise ValueError(f"step cost coefficients must be finite and non-negative: {self}")

    def values(self) -> tuple[float, ...]:
        """The coefficients, in FEATURES order."""
        return self.step, self.token, self.sampled, self.context, self.pair, self.large

    def with_values(self, values: Iterable[float]) -> CostCoefficients:
        """These coefficients replaced by `values` (in FEATURES order), the threshold kept."""
        step, token, sampled, context, pair, large = (float(v) for v in values)
        return CostCoefficients(step, token, sampled, context, pair, large, self.large_above)

    def seconds(self, shape: StepShape) -> float:
        return float(np.dot(self.values(), shape.features(self.large_above)))

    def is_large(self, tokens: int) -> bool:
        return 0 < self.large_above < tokens

    def chunk_seconds(self, tokens: int, start: int, completes: bool) -> float:
        """What a prompt chunk of `tokens` tokens, its first at position `start`, adds to a step: its tokens,
        its context (start + tokens), its attention pairs, and a sampled row if it completes the prompt."""
        pairs = tokens * start + tokens * (tokens + 1) // 2
        return (self.token * tokens + self.context * (start + tokens) + self.pair * pairs
                + (self.sampled if completes else 0.0))

    @classmethod
    def roofline(cls, shape: ModelShape, weight_bytes: float, kv_bytes_per_token: float, bandwidth: float,
                 flops: float, overhead_s: float, large_s: float = 0.0, large_above: int = 0) -> CostCoefficients:
        """A roofline's memory and compute times added rather than maxed: never under the roofline, so a
        planner seeded with it starts cautious; the online fit then finds where the machine overlaps them."""
        return cls(overhead_s + weight_bytes / bandwidth,
                   2 * shape.layer_params / flops + kv_bytes_per_token / bandwidth, 2 * shape.head_params / flops,
                   kv_bytes_per_token / bandwidth, shape.attention_flops_per_context / flops, large_s, large_above)
