"""Shared helpers for the kvpool tests. Some read private fields: the tests pin exact orders and counts that
the KVCacheManager protocol (all the scheduler needs) does not show."""

from collections.abc import Sequence

from kvpool.block_tables import BlockTables
from kvpool.table import slots_for


def free_queue(manager: BlockTables) -> list[int]:
    """The free queue in hand-out order."""
    return list(manager._pool.free_queue)


def num_tokens(manager: BlockTables, seq_id: int) -> int:
    """Tokens the sequence's table covers (the scheduler keeps its own count)."""
    return manager._table(seq_id).num_tokens


def slots(manager: BlockTables, seq_id: int, start: int, end: int) -> list[int]:
    """Slot ids of the sequence's token positions [start, end), read off its block table."""
    return slots_for(manager.block_table(seq_id), manager.block_size, start, end)


def append(manager: BlockTables, seq_id: int, token_ids: Sequence[int], count: int) -> list[int] | None:
    """One sequence's append: the slots of its `count` new tokens, or None when the pool is out of blocks."""
    start = num_tokens(manager, seq_id)
    done, _ = manager.append([seq_id], [token_ids], [count])
    return slots(manager, seq_id, start, start + count) if done else None


def blocks_needed(manager: BlockTables, seq_id: int, count: int) -> int:
    """Free blocks an append of `count` tokens takes, worked out from the table alone: the blocks to add, and a
    copy of each shared block the new tokens land in."""
    table, size, refs = manager._table(seq_id), manager.block_size, manager._pool.ref_counts
    end = table.num_tokens + count
    held = range(table.num_tokens // size, min(-(-end // size), len(table.blocks)))
    return max(0, -(-end // size) - len(table.blocks)) + sum(refs[table.blocks[i]] > 1 for i in held)


def snapshot(manager: BlockTables, seq_ids: list[int]) -> object:
    """Everything observable about the pool, to prove a failed call changed nothing."""
    tables = {s: (manager.block_table(s), num_tokens(manager, s)) for s in seq_ids if manager.has_sequence(s)}
    return manager.stats(), free_queue(manager), list(manager._pool.ref_counts), tables
