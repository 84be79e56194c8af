import pytest

from kvpool import (
    DuplicateSequenceError,
    KVPoolError,
    NoFreeBlocksError,
    PagedKVCacheManager,
    UnknownSequenceError,
)
from kvpool.table import slots_for
from tests.kvpool.helpers import append, free_queue, num_tokens, slots, snapshot


def make(num_blocks: int = 8, block_size: int = 4, caching: bool = True) -> PagedKVCacheManager:
    return PagedKVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)


def test_allocate_hands_out_blocks_in_order() -> None:
    manager = make()
    assert manager.allocate(1, list(range(10)), 10) == 0  # nothing cached
    assert manager.block_table(1) == [0, 1, 2]
    assert slots(manager, 1, 0, 10) == list(range(10))
    assert num_tokens(manager, 1) == 10
    manager.allocate(2, [50, 51, 52], 3)
    assert manager.block_table(2) == [3]
    assert slots(manager, 2, 0, 3) == [12, 13, 14]
    assert manager.stats().free_blocks == 4
    manager.check_invariants()


def test_chunked_prefill_then_decode_slots() -> None:
    manager = make()
    prompt = list(range(100, 110))
    manager.allocate(1, prompt, 6)
    assert slots(manager, 1, 0, 6) == [0, 1, 2, 3, 4, 5]
    assert append(manager, 1, prompt, 4) == [6, 7, 8, 9]  # second chunk grows by one block
    assert manager.block_table(1) == [0, 1, 2]
    tokens = [*prompt, 7, 8, 9]
    assert append(manager, 1, tokens[:11], 1) == [10]
    assert append(manager, 1, tokens[:12], 1) == [11]
    assert append(manager, 1, tokens, 1) == [12]  # first token of a new block
    assert manager.block_table(1) == [0, 1, 2, 3]
    assert append(manager, 1, tokens, 0) == []
    manager.check_invariants()


def test_block_table_is_a_copy() -> None:
    manager = make()
    manager.allocate(1, [1, 2, 3], 3)
    manager.block_table(1).append(99)
    assert manager.block_table(1) == [0]


def test_free_releases_tail_first_so_the_last_block_is_reused_first() -> None:
    manager = make(caching=False)
    manager.allocate(1, list(range(12)), 12)  # blocks 0, 1, 2
    manager.free(1)
    assert free_queue(manager) == [0, 1, 2, 3, 4, 5, 6, 7]  # 2 pushed to the front, then 1, then 0
    manager.allocate(2, list(range(5)), 5)
    assert manager.block_table(2) == [0, 1]
    manager.check_invariants()


def test_uncached_blocks_are_reused_before_cached_ones() -> None:
    manager = make()
    manager.allocate(1, list(range(10)), 10)  # blocks 0, 1 full (cached), 2 partial
    manager.free(1)
    assert free_queue(manager) == [2, 3, 4, 5, 6, 7, 1, 0]
    assert manager.stats().cached_free_blocks == 2


def test_allocate_past_capacity_raises_and_changes_nothing() -> None:
    manager = make(num_blocks=4)
    manager.allocate(1, list(range(9)), 9)
    before = snapshot(manager, [1, 2])
    assert not manager.can_allocate(list(range(100, 108)), 8)
    with pytest.raises(NoFreeBlocksError):
        manager.allocate(2, list(range(100, 108)), 8)
    assert snapshot(manager, [1, 2]) == before
    assert not manager.has_sequence(2)
    assert manager.can_allocate(list(range(100, 104)), 4)


def test_append_out_of_blocks_returns_none_and_changes_nothing() -> None:
    manager = make(num_blocks=2)
    tokens = list(range(9))
    manager.allocate(1, tokens, 8)
    before = snapshot(manager, [1])
    assert append(manager, 1, tokens, 1) is None
    assert snapshot(manager, [1]) == before


def test_preempt_then_retry_after_freeing_someone() -> None:
    manager = make(num_blocks=3)
    manager.allocate(1, list(range(8)), 8)
    manager.allocate(2, [9], 1)
    tokens = list(range(9))
    assert append(manager, 1, tokens, 1) is None
    manager.free(2)  # the scheduler preempts seq 2 ...
    assert append(manager, 1, tokens, 1) == [8]  # ... and retries: seq 2's block comes back
    assert manager.block_table(1) == [0, 1, 2]


def test_error_cases() -> None:
    manager = make()
    manager.allocate(1, [1, 2], 2)
    with pytest.raises(DuplicateSequenceError):
        manager.allocate(1, [3], 1)
    with pytest.raises(UnknownSequenceError):
        manager.free(2)
    with pytest.raises(UnknownSequenceError):
        manager.append([2], [[1]], [1])
    with pytest.raises(UnknownSequenceError):
        manager.block_table(2)
    with pytest.raises(UnknownSequenceError):
        manager.fork(2, 3)
    with pytest.raises(DuplicateSequenceError):
        manager.fork(1, 1)
    manager.free(1)
    with pytest.raises(UnknownSequenceError):  # double free
        manager.free(1)
    assert manager.stats().free_blocks == 8
    manager.check_invariants()


def test_errors_share_a_base_class() -> None:
    for error in (NoFreeBlocksError, UnknownSequenceError, DuplicateSequenceError):
        assert issubclass(error, KVPoolError)


@pytest.mark.parametrize(("tokens", "num_tokens"), [([], 1), ([1, 2], 0), ([1, 2], 3)])
def test_allocate_rejects_bad_token_counts(tokens: list[int], num_tokens: int) -> None:
    manager = make()
    with pytest.raises(ValueError):
        manager.allocate(1, tokens, num_tokens)
    assert not manager.has_sequence(1)


def test_append_refuses_a_negative_count() -> None:
    # (A count past the tokens known is a speculative append: tests/kvpool/test_truncate.py.)
    manager = make()
    manager.allocate(1, [1, 2], 2)
    with pytest.raises(ValueError):
        manager.append([1], [[1, 2, 3]], [-1])
    assert num_tokens(manager, 1) == 2


def test_slots_for_spans_blocks() -> None:
    assert slots_for([7, 3, 9], 4, 2, 10) == [30, 31, 12, 13, 14, 15, 36, 37]
    assert slots_for([7, 3], 4, 5, 6) == [13]
    assert slots_for([7, 3], 4, 4, 8) == [12, 13, 14, 15]
    assert slots_for([7], 4, 4, 4) == []
