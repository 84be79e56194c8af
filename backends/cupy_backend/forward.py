"""The Llama forward over the paged KV cache with our kernels and the weight products of projections.py (GEMMs,
or the dequantizing GEMV for matrices kept as the file stores them).

The residual stream follows the fused-add pattern: `residual` holds the running sum in the storage dtype and
each fused_add_rms_norm adds the previous block's output into it and normalises the result, so every
residual add costs no extra pass. In float32 this is the NumPy backend's `x = x + f(norm(x))` exactly, up
to the order of the RMS sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.cupy_backend.device_model import DeviceKVCache, DeviceLayer, DeviceWeights
from backends.cupy_backend.ops import Kernels
from backends.cupy_backend.projections import Projections, take_rows
from backends.cupy_backend.step_inputs import DeviceStep

if TYPE_CHECKING:
    from backends.model.config import ModelConfig


class Forward:
    def __init__(self, config: ModelConfig, weights: DeviceWeights, kernels: Kernels, proj: Projections) -> None:
        self.eps = config.rms_eps
        self.shape = config
        self.weights, self.k, self.proj = weights, kernels, proj

    def hidden_states(self, step: DeviceStep, cache: DeviceKVCache) -> tuple[Any, Any]:
        """Runs every token through all layers, writing their K/V. Returns (x, residual): the final hidden
        state is x + residual, left unsummed so the final norm fuses the add for the rows it needs."""
        x = self.proj.embed(self.weights.embedding, step.token_ids)
        residual = x
        h = self.k.rms_norm(x, self.weights.layers[0].attn_norm, self.eps)
        for index, layer in enumerate(self.weights.layers):
            if index > 0:
                h = self.k.fused_add_rms_norm(x, residual, layer.attn_norm, self.eps)
            attn = self._attention(index, layer, h, step, cache)
            h = self.k.fused_add_rms_norm(attn, residual, layer.ffn_norm, self.eps)
            x = self._mlp(layer, h)
        return x, residual

    def logits(self, step: DeviceStep, x: Any, residual: Any) -> Any:
        """(S, vocab) float32 logits of the sampled rows only."""
        rows, call = step.sample_rows, self.k.launcher.call
        h = self.k.fused_add_rms_norm(call(take_rows, x, rows), call(take_rows, residual, rows),
                                      self.weights.final_norm, self.eps)
        return self.proj.logits(h, self.weights.lm_head)

    def _attention(self, index: int, layer: DeviceLayer, h: Any, step: DeviceStep, cache: DeviceKVCache) -> Any:
        qkv = self.proj.linear(h, layer.wqkv)
        k_cache, v_cache = cache.keys(index), cache.values(index)
        # Every K/V of the step is in the cache before any query reads it: a chunk attends to its own keys.
        self.k.rope_and_cache(step, qkv, self.shape, self.weights.cos_sin_cache, k_cache, v_cache)
        out = self.k.attention(step, qkv, self.shape, k_cache, v_cache)
        return self.proj.linear(out.reshape(step.num_tokens, self.shape.q_size), layer.wo)

    def _mlp(self, layer: DeviceLayer, h: Any) -> Any:
        return self.proj.linear(self.k.silu_mul(self.proj.linear(h, layer.w_gate_up)), layer.w_down)
