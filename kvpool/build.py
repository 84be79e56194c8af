"""The KV cache manager a configuration asks for: its layout is chosen here, once."""

from __future__ import annotations

from kvpool.config import KV_LAYOUTS, KVPoolConfig
from kvpool.contiguous import ContiguousKVCacheManager
from kvpool.manager import KVCacheManager
from kvpool.paged import PagedKVCacheManager
from kvpool.sizing import KVSpec, parse_size


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


def kv_cache_manager_from_config(config: KVPoolConfig, spec: KVSpec, max_model_len: int, extra_key: bytes = b""
                                 ) -> KVCacheManager:
    """The configured manager; without num_blocks, as many blocks of the model's KV as the memory budget holds."""
    if spec.block_size != config.block_size:
        raise ValueError(f"KVSpec.block_size {spec.block_size} != config block_size {config.block_size}")
    num_blocks = config.num_blocks
    if num_blocks is None:
        num_blocks = spec.num_blocks_for(parse_size(config.kv_cache_memory))
    return new_kv_cache_manager(config.kv_layout, num_blocks, config.block_size, max_model_len=max_model_len,
                                enable_prefix_caching=config.enable_prefix_caching, extra_key=extra_key)
