"""Shared helpers for the kvpool tests."""

from kvpool import KVCacheManager


def free_queue(manager: KVCacheManager) -> list[int]:
    """The free queue in hand-out order (reads a private field: tests pin exact eviction orders)."""
    return list(manager._pool.free_queue)


def snapshot(manager: KVCacheManager, seq_ids: list[int]) -> object:
    """Everything observable about the pool, to prove a failed call changed nothing."""
    tables = {s: (manager.block_table(s), manager.num_tokens(s)) for s in seq_ids if manager.has_sequence(s)}
    return manager.stats(), free_queue(manager), list(manager._pool.ref_counts), tables
