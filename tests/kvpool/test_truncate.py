"""Speculative appends and truncate(): slots for tokens not yet known, never published until accepted, given
back when rejected."""

import pytest

from kvpool import ContiguousKVCacheManager, PagedKVCacheManager
from tests.kvpool.helpers import free_queue, num_tokens


def _decoding(manager: PagedKVCacheManager, seq_id: int, tokens: list[int]) -> None:
    """A sequence whose prompt is computed and whose first sampled token waits for its KV."""
    manager.allocate(seq_id, tokens, len(tokens))
    tokens.append(100 + seq_id)


def test_blocks_of_proposed_tokens_are_not_published() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = [1, 2, 3]
    _decoding(manager, 1, tokens)  # 4 known, 3 computed
    proposed = [7, 8, 9, 10, 11]
    assert manager.append([1], [tokens], [1 + len(proposed)])[0] == 1
    assert num_tokens(manager, 1) == 9 and len(manager.block_table(1)) == 3
    # the first block holds known tokens only: published; the second holds proposals: not
    assert manager.num_cached_tokens([*tokens, 0]) == 4
    assert manager.num_cached_tokens([*tokens, 7, 8, 9, 10, 0]) == 4


def test_truncate_gives_back_rejected_blocks_and_publishes_accepted_ones() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = [1, 2, 3]
    _decoding(manager, 1, tokens)
    manager.append([1], [tokens], [6])  # positions 3..8: the known token and 5 proposals
    free_before = len(free_queue(manager))
    tokens += [7, 8, 9, 55]  # 3 proposals accepted, then the target's own token
    table = manager.truncate(1, 7, tokens)  # KV holds positions 0..6; position 7 (55) waits for the next step
    assert table == manager.block_table(1) and len(table) == 2
    assert len(free_queue(manager)) == free_before + 1
    assert manager.num_cached_tokens([*tokens[:8], 0]) == 4  # [1,2,3,104] cached; [7,8,9,55] not yet full
    manager.check_invariants()
    tokens.append(56)
    manager.append([1], [tokens], [1])  # the next decode fills the second block: now published
    assert manager.num_cached_tokens([*tokens[:8], 0]) == 8
    manager.check_invariants()


def test_a_rejected_proposal_never_reaches_the_prefix_cache() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = [1, 2, 3]
    _decoding(manager, 1, tokens)
    manager.append([1], [tokens], [5])  # positions 3..7: proposals 7, 8, 9, 10 fill block 1 entirely
    tokens.append(42)  # the first proposal rejected: the target's token instead
    manager.truncate(1, 4, tokens)
    tokens += [43, 44, 45, 46]
    manager.append([1], [tokens], [4])  # the real tokens now fill block 1
    assert manager.num_cached_tokens([1, 2, 3, 101, 7, 8, 9, 10, 0]) == 4
    assert manager.num_cached_tokens([*tokens[:8], 0]) == 8
    manager.check_invariants()


def test_truncate_under_a_fork_keeps_the_shared_blocks() -> None:
    manager = PagedKVCacheManager(10, 4)
    tokens = [1, 2, 3, 4, 5, 6]
    manager.allocate(1, tokens, 6)
    manager.fork(1, 2)
    child = [*tokens, 9]
    manager.append([2], [child], [4])  # copy-on-write of the shared partial block, then proposals
    manager.truncate(2, 7, [*child, 10])
    assert manager.block_table(1)[0] == manager.block_table(2)[0]
    manager.check_invariants()
    manager.free(2)
    manager.free(1)
    manager.check_invariants()


def test_truncate_of_the_contiguous_layout_keeps_the_reservation() -> None:
    manager = ContiguousKVCacheManager(8, 4, max_model_len=8)
    tokens = [1, 2, 3]
    manager.allocate(1, tokens, 3)
    tokens.append(4)
    manager.append([1], [tokens], [8])  # past the reservation
    assert len(manager.block_table(1)) == 3
    assert len(manager.truncate(1, 4, [*tokens, 5])) == 2
    manager.check_invariants()


def test_truncate_refuses_to_grow() -> None:
    manager = PagedKVCacheManager(8, 4)
    manager.allocate(1, [1, 2, 3], 3)
    with pytest.raises(ValueError):
        manager.truncate(1, 4, [1, 2, 3, 4])
