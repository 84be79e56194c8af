import pytest

from kvpool import NoFreeBlocksError, PagedKVCacheManager
from kvpool.prefix_cache import BlockHasher
from tests.kvpool.helpers import append, free_queue, slots, snapshot

PROMPT = list(range(10))  # bs 4: two full blocks + 2 tokens


def make(num_blocks: int = 8) -> PagedKVCacheManager:
    return PagedKVCacheManager(num_blocks, 4)


def test_shared_prefix_is_reused_and_last_token_recomputed() -> None:
    manager = make()
    manager.allocate(1, PROMPT, 10)
    assert manager.num_cached_tokens(PROMPT) == 8
    assert manager.allocate(2, PROMPT, 10) == 8
    assert slots(manager, 2, 8, 10) == [12, 13]
    assert manager.block_table(2) == [0, 1, 3]
    stats = manager.stats()
    assert (stats.prefix_queries, stats.prefix_hits, stats.used_blocks) == (20, 8, 4)
    assert stats.hit_rate == 8 / 20
    manager.check_invariants()


def test_full_prompt_hit_still_recomputes_the_last_token() -> None:
    manager = make()
    manager.allocate(1, list(range(8)), 8)  # blocks 0, 1 both full and cached
    assert manager.num_cached_tokens(list(range(8))) == 4  # capped below len(prompt)
    assert manager.num_cached_tokens(list(range(9))) == 8
    assert manager.num_cached_tokens(list(range(4))) == 0


def test_divergent_prompts_share_only_the_common_blocks() -> None:
    manager = make()
    manager.allocate(1, PROMPT, 10)
    other = [0, 1, 2, 3, 99, 5, 6, 7, 8, 9]
    assert manager.num_cached_tokens(other) == 4
    # the same tokens at another position (different parent hash) never hit
    assert manager.num_cached_tokens([4, 5, 6, 7, 0]) == 0


def test_freed_blocks_stay_cached_then_evict_in_lru_order() -> None:
    manager = make()
    manager.allocate(1, PROMPT, 10)
    manager.allocate(2, PROMPT, 10)  # [0, 1, 3]
    manager.free(1)
    manager.free(2)
    assert free_queue(manager) == [3, 2, 4, 5, 6, 7, 1, 0]
    assert manager.num_cached_tokens(PROMPT) == 8
    manager.allocate(3, list(range(100, 124)), 24)
    assert manager.block_table(3) == [3, 2, 4, 5, 6, 7]
    assert manager.stats().evictions == 0
    assert manager.num_cached_tokens(PROMPT) == 8
    manager.free(3)  # 6 cached blocks, released tail first: 7 goes in first, 3 last
    assert free_queue(manager) == [1, 0, 7, 6, 5, 4, 2, 3]
    manager.allocate(4, list(range(200, 204)), 4)  # evicts block 1: the prompt's second block
    assert manager.block_table(4) == [1]
    assert (manager.num_cached_tokens(PROMPT), manager.stats().evictions) == (4, 1)
    manager.allocate(5, list(range(300, 304)), 4)  # then block 0, the root
    assert manager.block_table(5) == [0]
    assert (manager.num_cached_tokens(PROMPT), manager.stats().evictions) == (0, 2)
    manager.check_invariants()


def test_revived_blocks_leave_the_free_queue() -> None:
    manager = make()
    manager.allocate(1, PROMPT, 10)
    manager.free(1)
    assert manager.allocate(2, [*PROMPT, 10, 11], 12) == 8
    assert manager.block_table(2) == [0, 1, 2]
    assert free_queue(manager) == [3, 4, 5, 6, 7]
    assert manager.stats().cached_free_blocks == 0
    manager.check_invariants()


def test_can_allocate_does_not_count_revived_blocks_as_free() -> None:
    manager = make(num_blocks=4)
    manager.allocate(1, list(range(9)), 9)
    manager.free(1)
    assert manager.stats().free_blocks == 4
    assert manager.can_allocate(list(range(16)), 16)  # 2 cached + 2 new
    longer = list(range(20))  # 2 cached + 3 new, but reviving leaves only 2 free
    assert not manager.can_allocate(longer, 20)
    before = snapshot(manager, [])
    with pytest.raises(NoFreeBlocksError):
        manager.allocate(2, longer, 20)
    assert snapshot(manager, []) == before
    manager.allocate(2, list(range(16)), 16)
    assert manager.block_table(2) == [0, 1, 2, 3]
    assert manager.stats().evictions == 0


def test_identical_in_use_block_keeps_the_cache_entry() -> None:
    manager = make()
    manager.allocate(1, list(range(8)), 8)
    manager.allocate(2, list(range(8)), 8)  # recomputes block 1's tokens into block 2
    assert manager.block_table(2) == [0, 2]
    manager.free(1)
    manager.free(2)
    assert free_queue(manager) == [2, 3, 4, 5, 6, 7, 1, 0]  # 2 is a private copy: reused first
    assert manager.stats().cached_free_blocks == 2
    manager.check_invariants()


def test_identical_free_block_hands_its_hash_to_the_new_one() -> None:
    manager = make()
    manager.allocate(1, list(range(8)), 8)
    manager.free(1)
    manager.allocate(2, list(range(8)), 8)  # hit block 0; block 2 gets block 1's hash
    assert manager.block_table(2) == [0, 2]
    assert free_queue(manager) == [1, 3, 4, 5, 6, 7]
    assert manager.stats().cached_free_blocks == 0
    assert manager.stats().evictions == 0
    manager.free(2)
    assert manager.num_cached_tokens(list(range(9))) == 8
    manager.check_invariants()


def test_decode_tokens_fill_blocks_that_become_cached() -> None:
    manager = make()
    tokens = [1, 2, 3]
    manager.allocate(1, tokens, 3)
    for token in (4, 5, 6):
        tokens.append(token)
        append(manager, 1, tokens, 1)
    assert manager.num_cached_tokens([1, 2, 3, 4, 5]) == 4
    manager.free(1)
    assert manager.num_cached_tokens([1, 2, 3, 4, 5]) == 4  # preempted work survives in the cache


def test_reset_prefix_cache_forgets_everything() -> None:
    manager = make()
    manager.allocate(1, PROMPT, 10)
    manager.allocate(2, list(range(50, 60)), 10)
    manager.free(2)
    manager.reset_prefix_cache()
    assert manager.num_cached_tokens(PROMPT) == 0
    assert manager.stats().cached_free_blocks == 0
    manager.check_invariants()
    manager.free(1)
    manager.check_invariants()


def test_caching_disabled_never_hits() -> None:
    manager = PagedKVCacheManager(8, 4, enable_prefix_caching=False)
    manager.allocate(1, PROMPT, 10)
    assert manager.num_cached_tokens(PROMPT) == 0
    assert manager.allocate(2, PROMPT, 10) == 0
    assert manager.block_table(2) == [3, 4, 5]
    assert manager.stats().prefix_queries == 20


def test_extra_key_separates_caches() -> None:
    plain, keyed = BlockHasher(4), BlockHasher(4, b"model-b")
    root = plain.root
    assert plain.hash_block(root, [1, 2, 3, 4]) == BlockHasher(4).hash_block(root, [1, 2, 3, 4])
    assert plain.hash_block(root, [1, 2, 3, 4]) != keyed.hash_block(root, [1, 2, 3, 4])
    assert plain.hash_block(root, [1, 2, 3, 4]) != plain.hash_block(root, [1, 2, 3, 5])
    assert len(plain.hash_block(root, (1, 2, 3, 4))) == 32


def test_bulk_chain_equals_block_by_block_chain() -> None:
    hasher = BlockHasher(4, b"m")
    tokens = list(range(40, 57))
    one_by_one: list[bytes] = []
    for _ in range(4):
        one_by_one.append(hasher.chain_next(one_by_one, tokens))
    assert hasher.extend_chain([], tokens, 4) == one_by_one
    assert hasher.extend_chain(one_by_one[:1], tokens, 3) == one_by_one[1:]
    assert hasher.extend_chain(one_by_one, tokens, 0) == []
