"""The forward's kernel calls: geometry from launch.py, arguments in the kernels' order, outputs allocated
here. Strided q/k/v views into the fused QKV output are passed as flat views starting at their first element,
with the row stride as an argument (how a kernel pointer sees a sub-tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backends.cupy_backend import launch
from backends.cupy_backend.decode_policy import DecodePolicy
from backends.cupy_backend.launcher import KernelLauncher
from backends.cupy_backend.step_inputs import DeviceStep
from backends.cupy_backend.storage import Storage
from backends.model.config import ModelConfig


def flat_from(a: Any, offset: int) -> Any:
    """A contiguous 1-D view of C-contiguous `a` starting `offset` elements in: a pointer into `a`."""
    return a.reshape(-1)[offset:]


@dataclass(frozen=True)
class Kernels:
    xp: Any
    launcher: KernelLauncher
    storage: Storage
    partition_size: int = launch.DEFAULT_PARTITION_SIZE
    split_decode: bool | None = None  # None: the policy decides; benchmarks force either
    policy: DecodePolicy = DecodePolicy()

    def partitioned(self, step: DeviceStep, shape: ModelConfig, window: int = 0) -> bool:
        """Whether a decode step splits its contexts (a sliding layer's: its window of them) into partitions."""
        if self.split_decode is not None:
            return self.split_decode
        span = launch.attended_span(step.max_context_len, window)
        return self.policy.partitioned(span, step.num_seqs, shape.num_heads, shape.head_dim, self.partition_size,
                                       self.dtype)

    @property
    def dtype(self) -> str:
        return self.storage.name

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        out = self.xp.empty_like(x)
        tokens, hidden = x.shape
        self.launcher.launch(launch.rms_norm(self.dtype, tokens, hidden), [out, x, weight, eps, hidden])
        return out

    def fused_add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> Any:
        """residual += x (in place, storage dtype); returns rms_norm(residual)."""
        out = self.xp.empty_like(x)
        tokens, hidden = x.shape
        spec = launch.fused_add_rms_norm(self.dtype, tokens, hidden)
        self.launcher.launch(spec, [out, x, residual, weight, eps, hidden])
        return out

    def gated_activation(self, gate_up: Any, activation: str) -> Any:
        """act(gate) * up of rows [gate | up], act the architecture's `activation`."""
        tokens, width = gate_up.shape
        out = self.xp.empty((tokens, width // 2), dtype=gate_up.dtype)
        spec = launch.gated_activation(activation, self.dtype, tokens, width // 2)
        self.launcher.launch(spec, [out, gate_up, width // 2])
        return out

    def head_rms_norm(self, qkv: Any, q_weight: Any, k_weight: Any, eps: float, shape: ModelConfig) -> None:
        """QK norm: every Q and K head inside the fused QKV rows normalised in place."""
        spec = launch.head_rms_norm(self.dtype, qkv.shape[0], shape.num_heads, shape.num_kv_heads)
        args = [qkv, q_weight, k_weight, eps, shape.num_heads, shape.head_dim, shape.qkv_width]
        self.launcher.launch(spec, args)

    def scale(self, x: Any, factor: float) -> Any:
        """x times factor, in float32, rounded once to the storage dtype (Gemma's embedding scale)."""
        return self.launcher.call(self._scaled, x, factor)

    def add_bias(self, x: Any, bias: Any) -> Any:
        """x (rows, n) plus bias (n,), in float32, rounded once to the storage dtype (Qwen2's QKV biases)."""
        return self.launcher.call(self._biased, x, bias)

    def _scaled(self, x: Any, factor: float) -> Any:
        return self.storage.encode(self.xp, self.storage.decode(self.xp, x) * self.xp.float32(factor))

    def _biased(self, x: Any, bias: Any) -> Any:
        xp, storage = self.xp, self.storage
        return storage.encode(xp, storage.decode(xp, x) + storage.decode(xp, bias))

    def rope_and_cache(self, step: DeviceStep, qkv: Any, shape: ModelConfig, cos_sin_cache: Any, k_cache: Any,
                       v_cache: Any) -> None:
        """Rotates q inside the fused QKV rows in place, and writes each token's K (rotated) and V into its
        cache slot; pairs as the architecture's rope_pairs says."""
        rot_dim, width = int(cos_sin_cache.shape[1]), shape.qkv_width
        spec = launch.rope_and_cache(self.dtype, step.num_tokens, shape.num_heads, shape.num_kv_heads,
                                     shape.head_dim, rot_dim)
        rows = [flat_from(qkv, 0), flat_from(qkv, shape.q_size), flat_from(qkv, shape.q_size + shape.kv_size)]
        args = [step.positions, *rows, k_cache, v_cache, step.slot_mapping, cos_sin_cache, rot_dim]
        sizes = [shape.num_heads, shape.num_kv_heads, shape.head_dim, width, width]
        self.launcher.launch(spec, [*args, *sizes, int(shape.arch.rope_pairs == "halves")])

    def attention(self, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any, v_cache: Any,
                  window: int = 0) -> Any:
        """(T, heads, head_dim) attention output of every query row, over the cache (already holding this
        step's K/V); window > 0: a sliding layer's, over the last `window` positions. Decode-only steps use the
        decode kernel, split into partitions for long spans; a step with any prefill chunk runs the prefill
        kernel over the whole batch (decode rows are 1-token chunks)."""
        out = self.xp.empty((step.num_tokens, shape.num_heads, shape.head_dim), dtype=qkv.dtype)
        args = self._attention_args(step, qkv, shape, k_cache, v_cache)
        if not step.decode_only:
            self._prefill(out, step, shape, args, window)
        elif self.partitioned(step, shape, window):
            self._decode_partitioned(out, step, shape, args, window, int(k_cache.shape[1]))
        else:
            spec = launch.paged_attention_decode(self.dtype, shape.head_dim, step.num_seqs, shape.num_heads,
                                                 shape.num_kv_heads, int(k_cache.shape[1]))
            self.launcher.launch(spec, [out, *args, window])
        return out

    def _attention_args(self, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any,
                        v_cache: Any) -> list[Any]:
        """q, caches, tables, context lens, scale, num_kv_heads, max_blocks, block_size, q_stride."""
        scale = 1.0 / math.sqrt(shape.head_dim)
        tables = [step.block_tables, step.context_lens]
        head = [flat_from(qkv, 0), k_cache, v_cache, *tables, scale, shape.num_kv_heads, step.max_blocks]
        return [*head, int(k_cache.shape[1]), shape.qkv_width]

    def _prefill(self, out: Any, step: DeviceStep, shape: ModelConfig, args: list[Any], window: int) -> None:
        spec = launch.paged_prefill_attention(self.dtype, shape.head_dim, step.num_seqs, shape.num_heads,
                                              shape.num_kv_heads, step.max_query_len)
        q, k, v, tables, lens, *rest = args
        self.launcher.launch(spec, [out, q, k, v, tables, lens, step.query_start, *rest, window])

    def _decode_partitioned(self, out: Any, step: DeviceStep, shape: ModelConfig, args: list[Any],
                            window: int, block_size: int) -> None:
        seqs, heads, size = step.num_seqs, shape.num_heads, self.partition_size
        spec = launch.paged_attention_decode_partitioned(self.dtype, shape.head_dim, seqs, heads,
                                                         shape.num_kv_heads, step.max_context_len, size, window,
                                                         block_size)
        parts = spec.grid[2]
        exp_sums = self.xp.empty((seqs, heads, parts), dtype=self.xp.float32)
        max_logits = self.xp.empty((seqs, heads, parts), dtype=self.xp.float32)
        tmp_out = self.xp.empty((seqs, heads, parts, shape.head_dim), dtype=self.xp.float32)
        self.launcher.launch(spec, [exp_sums, max_logits, tmp_out, *args, size, window])
        reduce = launch.paged_attention_reduce(self.dtype, shape.head_dim, seqs, heads)
        self.launcher.launch(reduce, [out, exp_sums, max_logits, tmp_out, step.context_lens, parts, size, window])
