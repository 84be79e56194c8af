from kvpool import PagedKVCacheManager
from tests.kvpool.helpers import append, num_tokens


def make(num_blocks: int = 8) -> PagedKVCacheManager:
    return PagedKVCacheManager(num_blocks, 4)


def test_fork_shares_every_block() -> None:
    manager = make()
    manager.allocate(1, list(range(6)), 6)
    manager.fork(1, 2)
    assert manager.block_table(2) == manager.block_table(1) == [0, 1]
    assert num_tokens(manager, 2) == 6
    stats = manager.stats()
    assert stats.used_blocks == 2
    manager.check_invariants()


def test_first_write_into_shared_partial_block_copies_it() -> None:
    manager = make()
    parent = list(range(6))
    manager.allocate(1, parent, 6)
    manager.fork(1, 2)
    child = [*parent, 60]
    assert append(manager, 2, child, 1) == [2 * 4 + 2]  # block 1 copied into block 2
    assert manager.block_table(2) == [0, 2]
    assert manager.take_block_copies() == [(1, 2)]
    assert manager.take_block_copies() == []
    parent.append(70)
    assert append(manager, 1, parent, 1) == [6]  # block 1 is no longer shared: written in place
    assert manager.take_block_copies() == []
    manager.check_invariants()


def test_an_append_needs_a_free_block_for_the_copy() -> None:
    manager = make(num_blocks=2)
    manager.allocate(1, [1, 2], 2)
    manager.fork(1, 2)
    manager.allocate(3, [5], 1)
    assert manager.stats().free_blocks == 0
    assert append(manager, 2, [1, 2, 3], 1) is None
    assert manager.take_block_copies() == []
    manager.free(3)
    assert append(manager, 2, [1, 2, 3], 1) == [1 * 4 + 2]
    assert manager.take_block_copies() == [(0, 1)]


def test_fork_at_a_block_boundary_needs_no_copy() -> None:
    manager = make()
    manager.allocate(1, list(range(8)), 8)
    manager.fork(1, 2)
    assert append(manager, 2, [*range(8), 99], 1) == [8]
    assert manager.block_table(2) == [0, 1, 2]
    assert manager.take_block_copies() == []


def test_n_way_fork_copies_once_per_writer() -> None:
    manager = make()
    prompt = list(range(5))
    manager.allocate(1, prompt, 5)  # [0, 1]
    for child in (2, 3):
        manager.fork(1, child)
    for seq, token in ((1, 10), (2, 20), (3, 30)):
        append(manager, seq, [*prompt, token], 1)
    assert manager.take_block_copies() == [(1, 2), (1, 3)]  # the last writer keeps the original
    assert [manager.block_table(s) for s in (1, 2, 3)] == [[0, 2], [0, 3], [0, 1]]
    for seq in (1, 2, 3):
        manager.free(seq)
    assert manager.stats().free_blocks == 8
    manager.check_invariants()


def test_forked_children_fill_and_cache_their_own_blocks() -> None:
    manager = make()
    prompt = list(range(6))
    manager.allocate(1, prompt, 6)
    manager.fork(1, 2)
    append(manager, 1, [*prompt, 6, 7], 2)
    append(manager, 2, [*prompt, 8, 9], 2)
    assert manager.num_cached_tokens([*prompt, 6, 7, 0]) == 8
    assert manager.num_cached_tokens([*prompt, 8, 9, 0]) == 8
    manager.check_invariants()
