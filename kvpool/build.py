"""The KV cache manager a configuration asks for: its layout is chosen here, once."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.config import KV_LAYOUTS, KVPoolConfig
from kvpool.contiguous import ContiguousKVCacheManager
from kvpool.hybrid import HybridKVCacheManager
from kvpool.manager import KVCacheManager
from kvpool.paged import PagedKVCacheManager
from kvpool.sizing import KVSpec, parse_size, window_blocks_wanted, window_table_blocks
from kvpool.window import WindowTables


@dataclass(frozen=True)
class StepDemand:
    """What the scheduler may ask of the pool in one step: how many sequences run, how many tokens it computes."""

    running_seqs: int = 1
    step_tokens: int = 1


def new_kv_cache_manager(kv_layout: str, num_blocks: int, block_size: int, *, max_model_len: int,
                         enable_prefix_caching: bool = True, extra_key: bytes = b"") -> KVCacheManager:
    """A PagedKVCacheManager, or the ContiguousKVCacheManager baseline reserving max_model_len per sequence
    (which shares nothing, so it has no prefix cache)."""
    if kv_layout == "paged":
        return PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                                   extra_key=extra_key)
    if kv_layout == "contiguous":
        return ContiguousKVCacheManager(num_blocks, block_size, max_model_len)
    raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")


def new_hybrid_manager(num_blocks: int, window_blocks: int, block_size: int, window: int, *,
                       step_tokens: int = 1, enable_prefix_caching: bool = True, extra_key: bytes = b""
                       ) -> HybridKVCacheManager:
    """Full-layer tables over num_blocks and sliding-layer tables over window_blocks; ValueError when the window
    pool cannot hold one sequence's window and a step's chunk, so that a sequence running alone always fits."""
    least = window_table_blocks(window, block_size, step_tokens)
    if window_blocks < least:
        raise ValueError(f"the sliding layers' pool needs at least {least} blocks (a {window}-position window "
                         f"and a {step_tokens}-token step), got {window_blocks}")
    window_tables = WindowTables(window_blocks, block_size, window, enable_prefix_caching=enable_prefix_caching,
                                 extra_key=extra_key)
    full = PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                               extra_key=extra_key)
    return HybridKVCacheManager(full, window_tables)


def kv_cache_manager_from_config(config: KVPoolConfig, spec: KVSpec, max_model_len: int, extra_key: bytes = b"",
                                 demand: StepDemand | None = None) -> KVCacheManager:
    """The configured manager; without num_blocks, as many blocks of the model's KV as the memory budget holds.
    A paged pool for a model with both sliding and full-attention layers (spec.split) gives the sliding layers a
    pool of their own, sized for `demand` unless num_window_blocks says; the full layers get the rest."""
    if spec.block_size != config.block_size:
        raise ValueError(f"KVSpec.block_size {spec.block_size} != config block_size {config.block_size}")
    if config.kv_layout == "paged" and spec.split:
        return _hybrid_from_config(config, spec, demand or StepDemand(), extra_key)
    num_blocks = config.num_blocks
    if num_blocks is None:
        num_blocks = spec.num_blocks_for(parse_size(config.kv_cache_memory))
    return new_kv_cache_manager(config.kv_layout, num_blocks, config.block_size, max_model_len=max_model_len,
                                enable_prefix_caching=config.enable_prefix_caching, extra_key=extra_key)


def _hybrid_from_config(config: KVPoolConfig, spec: KVSpec, demand: StepDemand, extra_key: bytes
                        ) -> HybridKVCacheManager:
    wanted = config.num_window_blocks or window_blocks_wanted(spec.sliding_window, config.block_size,
                                                              demand.running_seqs, demand.step_tokens)
    if config.num_blocks is not None:  # a small pool asked for still runs one sequence alone
        least = window_table_blocks(spec.sliding_window, config.block_size, demand.step_tokens)
        num_blocks = config.num_blocks
        window_blocks = config.num_window_blocks or max(least, min(wanted, config.num_blocks))
    else:
        num_blocks, window_blocks = spec.split_blocks_for(parse_size(config.kv_cache_memory), wanted)
    return new_hybrid_manager(num_blocks, window_blocks, config.block_size, spec.sliding_window,
                              step_tokens=demand.step_tokens, enable_prefix_caching=config.enable_prefix_caching,
                              extra_key=extra_key)
