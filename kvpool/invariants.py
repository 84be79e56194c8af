"""Consistency checks over the pool's bookkeeping, for tests and debugging (O(num_blocks))."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kvpool.block_pool import BlockPool
from kvpool.errors import KVInvariantError
from kvpool.table import SeqTable, blocks_for


def _fail(message: str) -> None:
    raise KVInvariantError(message)


def check_free_xor_referenced(pool: BlockPool) -> None:
    queued = list(pool.free_queue)
    if len(queued) != len(set(queued)) or not all(0 <= b < pool.num_blocks for b in queued):
        _fail(f"free queue holds duplicate or out-of-range ids: {queued}")
    for block, refs in enumerate(pool.ref_counts):
        if refs < 0 or (refs == 0) != (block in pool.free_queue):
            _fail(f"block {block}: ref count {refs}, in free queue: {block in pool.free_queue}")


def check_ref_counts(pool: BlockPool, tables: Mapping[int, SeqTable]) -> None:
    references: Counter[int] = Counter()
    for seq_id, table in tables.items():
        live = [b for b in table.blocks if b >= 0]  # -1: given back from behind a window (kvpool/window.py)
        if len(set(live)) != len(live):
            _fail(f"seq {seq_id}: a block appears twice in its table {table.blocks}")
        references.update(live)
    for block, refs in enumerate(pool.ref_counts):
        if refs != references[block]:
            _fail(f"block {block}: ref count {refs} but {references[block]} table references")


def check_hash_map(pool: BlockPool) -> None:
    for block_hash, block in pool.cached.items():
        if pool.block_hashes[block] != block_hash:
            _fail(f"hash map points at block {block}, which holds another hash")
    hashed = [b for b, h in enumerate(pool.block_hashes) if h is not None]
    if len(hashed) != len(pool.cached):
        _fail(f"{len(hashed)} blocks carry a hash but the map has {len(pool.cached)} entries")
    cached_free = sum(1 for b in hashed if pool.ref_counts[b] == 0)
    if cached_free != pool.num_cached_free:
        _fail(f"num_cached_free is {pool.num_cached_free}, counted {cached_free}")


def check_tables(
    pool: BlockPool, tables: Mapping[int, SeqTable], block_size: int, caching: bool, reserve: int
) -> None:
    for seq_id, table in tables.items():
        expected = max(reserve, blocks_for(table.num_tokens, block_size))
        if len(table.blocks) != expected:
            _fail(f"seq {seq_id}: {len(table.blocks)} blocks for {table.num_tokens} tokens, want {expected}")
        num_hashes = table.num_tokens // block_size if caching else 0
        if len(table.hashes) != num_hashes:
            _fail(f"seq {seq_id}: {len(table.hashes)} chain hashes, expected {num_hashes}")
        for block, block_hash in zip(table.blocks, table.hashes, strict=False):
            if block >= 0 and pool.block_hashes[block] not in (None, block_hash):
                _fail(f"seq {seq_id}: block {block} is cached under another prefix's hash")


def check_copies(pool: BlockPool, copies: list[tuple[int, int]]) -> None:
    for src, dst in copies:
        if not (0 <= src < pool.num_blocks and 0 <= dst < pool.num_blocks and src != dst):
            _fail(f"bad pending block copy {(src, dst)}")


def check_all(
    pool: BlockPool,
    tables: Mapping[int, SeqTable],
    copies: list[tuple[int, int]],
    block_size: int,
    caching: bool,
    reserve: int,
) -> None:
    check_free_xor_referenced(pool)
    check_ref_counts(pool, tables)
    check_hash_map(pool)
    check_tables(pool, tables, block_size, caching, reserve)
    check_copies(pool, copies)
