import pytest

from kvpool import ContiguousKVCacheManager, NoFreeBlocksError
from tests.kvpool.helpers import append, slots


def make(num_blocks: int = 40) -> ContiguousKVCacheManager:
    return ContiguousKVCacheManager(num_blocks, 16, max_model_len=100)


def test_reserves_max_model_len_up_front() -> None:
    manager = make()
    manager.allocate(1, list(range(10)), 10)
    assert manager.block_table(1) == [0, 1, 2, 3, 4, 5, 6]  # ceil(100 / 16)
    assert slots(manager, 1, 0, 10) == list(range(10))
    assert manager.stats().free_blocks == 33
    tokens = list(range(100))
    assert append(manager, 1, tokens, 90) == list(range(10, 100))
    assert manager.stats().free_blocks == 33  # never grows inside the reservation
    manager.check_invariants()


def test_fits_only_whole_reservations() -> None:
    manager = make()
    for seq in range(5):
        manager.allocate(seq, [1], 1)
    assert manager.stats().free_blocks == 5
    assert not manager.can_allocate([1], 1)
    with pytest.raises(NoFreeBlocksError):
        manager.allocate(5, [1], 1)
    manager.free(0)
    assert manager.can_allocate([1], 1)


def test_no_prefix_caching() -> None:
    manager = ContiguousKVCacheManager(40, 4, max_model_len=16)
    assert manager.allocate(1, list(range(10)), 10) == 0
    assert manager.num_cached_tokens(list(range(10))) == 0
    assert manager.allocate(2, list(range(10)), 10) == 0
    manager.free(1)
    assert manager.stats().cached_free_blocks == 0


def test_fork_copies_the_written_block_and_replaces_reserved_ones() -> None:
    manager = ContiguousKVCacheManager(12, 4, max_model_len=12)
    manager.allocate(1, [1, 2], 2)  # [0, 1, 2]
    manager.fork(1, 2)
    assert append(manager, 2, [1, 2, 3, 4, 5], 3) == [3 * 4 + 2, 3 * 4 + 3, 4 * 4]
    assert manager.block_table(2) == [3, 4, 2]  # block 1 was reserved, unwritten: replaced, not copied
    assert manager.take_block_copies() == [(0, 3)]
    manager.check_invariants()
