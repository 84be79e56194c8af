"""kvpool: the paged KV block pool (block ids, ref counts, LRU free queue, prefix caching, COW forks).

Stdlib only; the scheduler drives it through KVCacheManager, and only block ids and slot ids leave it.
"""

from kvpool.config import KVPoolConfig
from kvpool.errors import (
    DuplicateSequenceError,
    KVInvariantError,
    KVPoolError,
    NoFreeBlocksError,
    UnknownSequenceError,
)
from kvpool.manager import Allocation, KVCacheManager
from kvpool.sizing import KVSpec, parse_size
from kvpool.stats import KVStats

__all__ = [
    "Allocation",
    "DuplicateSequenceError",
    "KVCacheManager",
    "KVInvariantError",
    "KVPoolConfig",
    "KVPoolError",
    "KVSpec",
    "KVStats",
    "NoFreeBlocksError",
    "UnknownSequenceError",
    "parse_size",
]
