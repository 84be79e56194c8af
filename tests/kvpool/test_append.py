"""append: one step's appends for many sequences, reporting the table entries it sets."""

import pytest

from kvpool import ContiguousKVCacheManager, PagedKVCacheManager, UnknownSequenceError
from tests.kvpool.helpers import num_tokens, snapshot


def test_decode_tokens_in_place_change_no_entry() -> None:
    manager = PagedKVCacheManager(8, 4)
    seqs = {1: list(range(5)), 2: list(range(10, 17))}
    for seq_id, tokens in seqs.items():
        manager.allocate(seq_id, tokens, len(tokens))
        tokens.append(99)
    assert manager.append([1, 2], [seqs[1], seqs[2]], [1, 1]) == (2, [])
    assert num_tokens(manager, 1) == 6 and num_tokens(manager, 2) == 8
    manager.check_invariants()  # seq 2's second block just filled: it is hashed


def test_a_token_starting_a_block_reports_the_new_entry() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = list(range(8))
    manager.allocate(1, tokens, 8)
    tokens.append(8)
    assert manager.append([1], [tokens], [1]) == (1, [(0, 2, manager.block_table(1)[2], 0)])
    manager.check_invariants()


def test_a_full_block_filled_by_decode_is_cached() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = [1, 2, 3]
    manager.allocate(1, tokens, 3)
    tokens.append(4)
    manager.append([1], [tokens], [1])
    assert manager.num_cached_tokens([1, 2, 3, 4, 5]) == 4


def test_stops_at_the_first_sequence_out_of_blocks() -> None:
    manager = PagedKVCacheManager(3, 4)
    seqs = {1: list(range(4)), 2: list(range(10, 14)), 3: list(range(20, 22))}
    for seq_id, tokens in seqs.items():
        manager.allocate(seq_id, tokens, len(tokens))
    for tokens in seqs.values():
        tokens.append(7)
    before = snapshot(manager, [1, 2])
    # seq 1 needs a block and none is free: it and everything after it stay as they were
    assert manager.append([3, 1, 2], [seqs[3], seqs[1], seqs[2]], [1, 1, 1]) == (1, [])
    assert num_tokens(manager, 3) == 3
    after = snapshot(manager, [1, 2])
    assert after[1:] == before[1:]  # type: ignore[index]  # snapshot() is typed as object
    manager.free(3)  # the caller frees blocks, then resumes where it stopped
    assert manager.append([3, 1, 2], [seqs[3], seqs[1], seqs[2]], [1, 1, 1], 1) == (2, [(1, 1, 2, 0)])
    assert manager.block_table(1) == [0, 2]  # seq 3's block: seq 2 still finds none
    manager.check_invariants()


def test_copy_on_write_is_a_change_and_a_copy() -> None:
    manager = PagedKVCacheManager(8, 4)
    parent = list(range(6))
    manager.allocate(1, parent, 6)
    manager.fork(1, 2)
    child = [*parent, 60]
    assert manager.append([2], [child], [1]) == (1, [(0, 1, 2, 0)])
    assert manager.block_table(2) == [0, 2]
    assert manager.take_block_copies() == [(1, 2)]
    manager.check_invariants()


def test_prompt_chunks_report_every_new_block() -> None:
    manager = PagedKVCacheManager(8, 4)
    tokens = list(range(14))
    manager.allocate(1, tokens, 3)
    done, changes = manager.append([1], [tokens], [11])
    table = manager.block_table(1)
    assert done == 1 and changes == [(0, 1, table[1], 0), (0, 2, table[2], 0), (0, 3, table[3], 0)]


def test_contiguous_writes_into_its_reservation_and_reports_only_growth() -> None:
    manager = ContiguousKVCacheManager(8, 4, max_model_len=8)
    tokens = list(range(11))
    manager.allocate(1, tokens, 3)
    assert manager.append([1], [tokens], [5]) == (1, [])  # blocks 0, 1 were reserved at admission
    assert manager.append([1], [tokens], [3]) == (1, [(0, 2, 2, 0)])
    manager.check_invariants()


def test_unknown_sequence_raises() -> None:
    manager = PagedKVCacheManager(8, 4)
    with pytest.raises(UnknownSequenceError):
        manager.append([5], [[1, 2]], [1])
