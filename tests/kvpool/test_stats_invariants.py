import pytest

from kvpool import ContiguousKVCacheManager, KVInvariantError, KVStats, PagedKVCacheManager
from kvpool.block_tables import BlockTables


def test_stats_snapshot() -> None:
    manager = PagedKVCacheManager(10, 4)
    assert manager.stats() == KVStats(10, 0, 0, 10, 0.0, 0, 0, 0.0, 0)
    manager.allocate(1, list(range(9)), 9)
    manager.allocate(2, list(range(9)), 9)
    manager.free(1)
    stats = manager.stats()
    assert (stats.num_blocks, stats.used_blocks, stats.free_blocks, stats.cached_free_blocks) == (10, 3, 7, 0)
    assert stats.usage == pytest.approx(0.3)
    assert (stats.prefix_queries, stats.prefix_hits, stats.hit_rate) == (18, 8, 8 / 18)
    manager.free(2)
    assert manager.stats().cached_free_blocks == 2


def corrupt(manager: BlockTables, how: str) -> None:
    pool = manager._pool
    if how == "ref":
        pool.ref_counts[0] += 1
    elif how == "free_and_used":
        pool.free_queue.append(0)
    elif how == "hash":
        pool.block_hashes[1] = b"x" * 32
    elif how == "map":
        pool.cached[b"y" * 32] = 5
    elif how == "duplicate":
        manager._tables[1].blocks.append(0)
        pool.ref_counts[0] += 1
    elif how == "table_length":
        manager._tables[1].num_tokens = 4


@pytest.mark.parametrize("how", ["ref", "free_and_used", "hash", "map", "duplicate", "table_length"])
def test_check_invariants_catches_corruption(how: str) -> None:
    manager = PagedKVCacheManager(8, 4)
    manager.allocate(1, list(range(9)), 9)
    manager.check_invariants()
    corrupt(manager, how)
    with pytest.raises(AssertionError):
        manager.check_invariants()
    assert issubclass(KVInvariantError, AssertionError)


def test_a_contiguous_table_must_hold_its_reservation() -> None:
    manager = ContiguousKVCacheManager(8, 4, max_model_len=12)
    manager.allocate(1, [1, 2], 2)
    manager.check_invariants()
    manager._pool.release([manager._tables[1].blocks.pop()])  # 2 tokens need 1 block, but 3 are reserved
    with pytest.raises(KVInvariantError):
        manager.check_invariants()
