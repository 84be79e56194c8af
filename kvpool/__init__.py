"""kvpool: the paged KV block pool (block ids, ref counts, LRU free queue, prefix caching, COW forks).

Stdlib only; the scheduler drives it through the KVCacheManager protocol, which PagedKVCacheManager and the
ContiguousKVCacheManager baseline implement, and HybridKVCacheManager for a model whose sliding-window layers keep
their KV in a pool of their own (kv_cache_manager_from_config picks the configured one). Only block ids leave it.
"""

from kvpool.build import StepDemand, kv_cache_manager_from_config, new_hybrid_manager, new_kv_cache_manager
from kvpool.config import KVPoolConfig
from kvpool.contiguous import ContiguousKVCacheManager
from kvpool.errors import (
    DuplicateSequenceError,
    KVInvariantError,
    KVPoolError,
    NoFreeBlocksError,
    UnknownSequenceError,
)
from kvpool.hybrid import HybridKVCacheManager
from kvpool.manager import KVCacheManager, TableChange
from kvpool.paged import PagedKVCacheManager
from kvpool.sizing import KVSpec, parse_size
from kvpool.stats import KVStats

__all__ = [
    "ContiguousKVCacheManager",
    "DuplicateSequenceError",
    "HybridKVCacheManager",
    "KVCacheManager",
    "KVInvariantError",
    "KVPoolConfig",
    "KVPoolError",
    "KVSpec",
    "KVStats",
    "NoFreeBlocksError",
    "PagedKVCacheManager",
    "StepDemand",
    "TableChange",
    "UnknownSequenceError",
    "kv_cache_manager_from_config",
    "new_hybrid_manager",
    "new_kv_cache_manager",
    "parse_size",
]
