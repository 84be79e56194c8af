"""The forward's kernel calls: geometry from launch.py, arguments in the kernels' order, outputs allocated
here. Strided q/k/v views into the fused QKV output are passed as flat views starting at their first element,
with the row stride as an argument (how a kernel pointer sees a sub-tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backends.cupy_backend import launch
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
    split_decode: bool | None = None  # None: launch.use_partitioned_decode decides; benchmarks force either

    def partitioned(self, step: DeviceStep, num_heads: int) -> bool:
        if self.split_decode is not None:
            return self.split_decode
        return launch.use_partitioned_decode(step.max_context_len, step.num_seqs, num_heads, self.partition_size)

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

    def silu_mul(self, gate_up: Any) -> Any:
        tokens, width = gate_up.shape
        out = self.xp.empty((tokens, width // 2), dtype=gate_up.dtype)
        self.launcher.launch(launch.silu_mul(self.dtype, tokens, width // 2), [out, gate_up, width // 2])
        return out

    def rope_and_cache(self, step: DeviceStep, qkv: Any, shape: ModelConfig, cos_sin_cache: Any, k_cache: Any,
                       v_cache: Any) -> None:
        """Rotates q inside the fused QKV rows in place, and writes each token's K (rotated) and V into its
        cache slot."""
        rot_dim, width = int(cos_sin_cache.shape[1]), shape.qkv_width
        spec = launch.rope_and_cache(self.dtype, step.num_tokens, shape.num_heads, shape.num_kv_heads,
                                     shape.head_dim, rot_dim)
        rows = [flat_from(qkv, 0), flat_from(qkv, shape.q_size), flat_from(qkv, shape.q_size + shape.kv_size)]
        args = [step.positions, *rows, k_cache, v_cache, step.slot_mapping, cos_sin_cache, rot_dim]
        self.launcher.launch(spec, [*args, shape.num_heads, shape.num_kv_heads, shape.head_dim, width, width])

    def attention(self, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any, v_cache: Any) -> Any:
        """(T, heads, head_dim) attention output of every query row, over the cache (already holding this
        step's K/V). Decode-only steps use the decode kernel, split into partitions for long contexts; a step
        with any prefill chunk runs the prefill kernel over the whole batch (decode rows are 1-token chunks)."""
        out = self.xp.empty((step.num_tokens, shape.num_heads, shape.head_dim), dtype=qkv.dtype)
        if not step.decode_only:
            self._prefill(out, step, qkv, shape, k_cache, v_cache)
        elif self.partitioned(step, shape.num_heads):
            self._decode_partitioned(out, step, qkv, shape, k_cache, v_cache)
        else:
            spec = launch.paged_attention_decode(self.dtype, shape.head_dim, step.num_seqs, shape.num_heads,
                                                 shape.num_kv_heads)
            self.launcher.launch(spec, [out, *self._attention_args(step, qkv, shape, k_cache, v_cache)])
        return out

    def _attention_args(self, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any,
                        v_cache: Any) -> list[Any]:
        """q, caches, tables, context lens, scale, num_kv_heads, max_blocks, block_size, q_stride."""
        scale = 1.0 / math.sqrt(shape.head_dim)
        tables = [step.block_tables, step.context_lens]
        head = [flat_from(qkv, 0), k_cache, v_cache, *tables, scale, shape.num_kv_heads, step.max_blocks]
        return [*head, int(k_cache.shape[1]), shape.qkv_width]

    def _prefill(self, out: Any, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any,
                 v_cache: Any) -> None:
        spec = launch.paged_prefill_attention(self.dtype, shape.head_dim, step.num_seqs, shape.num_heads,
                                              shape.num_kv_heads, step.max_query_len)
        q, k, v, tables, lens, *rest = self._attention_args(step, qkv, shape, k_cache, v_cache)
        self.launcher.launch(spec, [out, q, k, v, tables, lens, step.query_start, *rest])

    def _decode_partitioned(self, out: Any, step: DeviceStep, qkv: Any, shape: ModelConfig, k_cache: Any,
                            v_cache: Any) -> None:
        seqs, heads, size = step.num_seqs, shape.num_heads, self.partition_size
        spec = launch.paged_attention_decode_partitioned(self.dtype, shape.head_dim, seqs, heads,
                                                         shape.num_kv_heads, step.max_context_len, size)
        parts = spec.grid[2]
        exp_sums = self.xp.empty((seqs, heads, parts), dtype=self.xp.float32)
        max_logits = self.xp.empty((seqs, heads, parts), dtype=self.xp.float32)
        tmp_out = self.xp.empty((seqs, heads, parts, shape.head_dim), dtype=self.xp.float32)
        args = self._attention_args(step, qkv, shape, k_cache, v_cache)
        self.launcher.launch(spec, [exp_sums, max_logits, tmp_out, *args, size])
        reduce = launch.paged_attention_reduce(self.dtype, shape.head_dim, seqs, heads)
        self.launcher.launch(reduce, [out, exp_sums, max_logits, tmp_out, step.context_lens, parts, size])
