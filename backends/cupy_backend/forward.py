"""The decoder forward over the paged KV cache with our kernels and the weight products of projections.py (GEMMs,
or the dequantizing GEMV for matrices kept as the file stores them), computing what the model's Architecture
says (backends/model/architecture.py), as the NumPy forward does: Llama's layer, and where the description asks
for them QKV biases, QK norms, RoPE over head halves, a RoPE base and attention window per layer, GeGLU, norms
after attention and the MLP, and scaled embeddings. Nothing here reads a family's name.

The residual stream follows the fused-add pattern: `residual` holds the running sum in the storage dtype and
each fused_add_rms_norm adds the previous block's output (through its sandwich norm, where the layer has one)
into it and normalises the result, so every residual add costs no extra pass. In float32 this is the NumPy
backend's `x = x + f(norm(x))` exactly, up to the order of the RMS sum.
"""

from __future__ import annotations

import math
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
        x = self._embed(step)
        residual = x
        h = self.k.rms_norm(x, self.weights.layers[0].attn_norm, self.eps)
        for index, layer in enumerate(self.weights.layers):
            if index > 0:
                h = self.k.fused_add_rms_norm(x, residual, layer.attn_norm, self.eps)
            attn = self._normed(layer.post_attn_norm, self._attention(index, layer, h, step, cache))
            h = self.k.fused_add_rms_norm(attn, residual, layer.ffn_norm, self.eps)
            x = self._normed(layer.post_ffn_norm, self._mlp(layer, h))
        return x, residual

    def _embed(self, step: DeviceStep) -> Any:
        x = self.proj.embed(self.weights.embedding, step.token_ids)
        if self.shape.arch.scale_embeddings:
            return self.k.scale(x, math.sqrt(self.shape.hidden_size))
        return x

    def _normed(self, weight: Any, x: Any) -> Any:
        """x through a sandwich norm where the layer has one."""
        return x if weight is None else self.k.rms_norm(x, weight, self.eps)

    def logits(self, step: DeviceStep, x: Any, residual: Any) -> Any:
        """(S, vocab) float32 logits of the sampled rows only."""
        rows, call = step.sample_rows, self.k.launcher.call
        h = self.k.fused_add_rms_norm(call(take_rows, x, rows), call(take_rows, residual, rows),
                                      self.weights.final_norm, self.eps)
        return self.proj.logits(h, self.weights.lm_head)

    def _attention(self, index: int, layer: DeviceLayer, h: Any, step: DeviceStep, cache: DeviceKVCache) -> Any:
        cfg, k_cache, v_cache = self.shape, cache.keys(index), cache.values(index)
        qkv = self._qkv(layer, h)
        kv_step = step.in_window_pool() if cache.in_window_pool(index) else step  # its pool's tables and slots
        # Every K/V of the step is in the cache before any query reads it: a chunk attends to its own keys.
        rope = self.weights.rope_tables[cfg.layer_rope_base(index)]
        self.k.rope_and_cache(kv_step, qkv, cfg, rope, k_cache, v_cache)
        out = self.k.attention(kv_step, qkv, cfg, k_cache, v_cache, cfg.layer_window(index))
        return self.proj.linear(out.reshape(step.num_tokens, cfg.q_size), layer.wo)

    def _qkv(self, layer: DeviceLayer, h: Any) -> Any:
        """The fused Q, K, V rows, biased and their Q and K heads normed where the layer has those."""
        qkv = self.proj.linear(h, layer.wqkv)
        if layer.qkv_bias is not None:
            qkv = self.k.add_bias(qkv, layer.qkv_bias)
        if layer.q_norm is not None:
            self.k.head_rms_norm(qkv, layer.q_norm, layer.k_norm, self.eps, self.shape)
        return qkv

    def _mlp(self, layer: DeviceLayer, h: Any) -> Any:
        gated = self.k.gated_activation(self.proj.linear(h, layer.w_gate_up), self.shape.arch.activation)
        return self.proj.linear(gated, layer.w_down)
