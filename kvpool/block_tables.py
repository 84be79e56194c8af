"""BlockTables: per-sequence block tables over one BlockPool, and all that both layouts do alike."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from kvpool.block_pool import BlockPool
from kvpool.errors import DuplicateSequenceError, NoFreeBlocksError, UnknownSequenceError
from kvpool.manager import TableChange
from kvpool.stats import KVStats, PrefixCounters
from kvpool.table import SeqTable, blocks_for


class BlockTables(ABC):
    """Admission, copy-on-write growth, forks and frees: the only writer of block tables (a KVCacheManager).

    A layout supplies `append()`, `check_invariants()`, `_shared_in_range()` (the blocks a write must un-share) and
    the prefix cache's `_cached_prefix()` and `_register_full_blocks()`; it may change `_blocks_to_cover()` (the
    blocks a table of n tokens holds).
    """

    group = 0  # what TableChanges from these tables carry (kvpool/manager.py)

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._pool = BlockPool.create(num_blocks)
        self._tables: dict[int, SeqTable] = {}
        self._copies: list[tuple[int, int]] = []
        self._counters = PrefixCounters()

    # --- admission -------------------------------------------------------------------------------

    def num_cached_tokens(self, token_ids: Sequence[int]) -> int:
        return len(self._cached_prefix(token_ids)[0]) * self.block_size

    def can_allocate(self, token_ids: Sequence[int], num_tokens: int) -> bool:
        _check_token_count(token_ids, num_tokens)
        return self.can_admit(self._cached_prefix(token_ids)[0], num_tokens)

    def can_admit(self, cached: list[int], num_tokens: int) -> bool:
        """Whether a sequence starting from these cached blocks would get blocks for num_tokens tokens."""
        return self._admission_need(cached, num_tokens) <= self._available(cached)

    def allocate(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> int:
        """Table for a new sequence: the cached prefix first, then new blocks up to num_tokens tokens. Returns the
        tokens the prefix cache served; the table covers max(num_tokens, those). Raises NoFreeBlocksError with
        state unchanged."""
        _check_token_count(token_ids, num_tokens)
        return self.admit(seq_id, token_ids, num_tokens, *self._cached_prefix(token_ids))

    def admit(self, seq_id: int, token_ids: Sequence[int], num_tokens: int, cached: list[int],
              hashes: list[bytes]) -> int:
        """allocate() from a cached prefix the caller looked up (its blocks and their chain hashes)."""
        if seq_id in self._tables:
            raise DuplicateSequenceError(f"sequence {seq_id} already has a block table")
        num_new = self._admission_need(cached, num_tokens)
        if num_new > self._available(cached):
            raise NoFreeBlocksError(f"sequence {seq_id}: not enough free blocks for {num_tokens} tokens")
        self._pool.touch(self._live(cached))  # revive cached blocks before allocate() could evict them
        cached_tokens = len(cached) * self.block_size
        table = SeqTable(cached + self._pool.allocate(num_new), max(num_tokens, cached_tokens), hashes)
        self._tables[seq_id] = table
        self._register_full_blocks(table, token_ids)
        self._counters.record(len(token_ids), cached_tokens)
        return cached_tokens

    @staticmethod
    def _live(blocks: list[int]) -> list[int]:
        """The blocks a table holds references to: all of them, except in a windowed table (kvpool/window.py)."""
        return blocks

    def _admission_need(self, cached: list[int], num_tokens: int) -> int:
        """New blocks an admission takes besides the cached ones."""
        return self._blocks_to_cover(max(num_tokens, len(cached) * self.block_size)) - len(cached)

    def _available(self, cached: list[int]) -> int:
        # Reviving a free cached block takes it out of the free queue, so it is not free capacity.
        return self._pool.num_free() - self._pool.num_free_among(self._live(cached))

    def _blocks_to_cover(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    @abstractmethod
    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Blocks and chain hashes of the longest cached prefix of a prompt."""

    @abstractmethod
    def _register_full_blocks(self, table: SeqTable, token_ids: Sequence[int]) -> None:
        """Publish the table's newly filled blocks in the prefix cache."""

    # --- growth ----------------------------------------------------------------------------------

    @abstractmethod
    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]: ...

    @abstractmethod
    def _shared_in_range(self, table: SeqTable, end: int) -> list[int]:
        """Table indices of shared blocks that tokens [table.num_tokens, end) would write into."""

    def _append(self, table: SeqTable, token_ids: Sequence[int], end: int, index: int,
                changes: list[TableChange]) -> bool:
        """Cover tokens up to `end`, un-sharing and growing the table and recording each entry it sets as
        (index, block index, block id); False, with nothing changed, when the pool lacks the blocks."""
        if end <= table.num_tokens:
            _check_append(table.num_tokens, end)
            return True
        grow, shared = self._growth(table, end), self._shared_in_range(table, end)
        if grow or shared:
            if grow + len(shared) > self._pool.num_free():
                return False
            self._make_room(table, grow, shared, index, changes)
        table.num_tokens = end
        self._register_full_blocks(table, token_ids)
        return True

    def _growth(self, table: SeqTable, end: int) -> int:
        """New blocks the table needs to cover `end` tokens."""
        return max(0, -(-end // self.block_size) - len(table.blocks))

    def _make_room(self, table: SeqTable, grow: int, shared: list[int], index: int,
                   changes: list[TableChange]) -> None:
        if shared:
            self._copy_on_write(table, shared)
        if grow:
            table.blocks.extend(self._pool.allocate(grow))
        blocks = table.blocks
        changes.extend((index, j, blocks[j], self.group) for j in [*shared, *range(len(blocks) - grow, len(blocks))])

    def _copy_on_write(self, table: SeqTable, indices: list[int]) -> None:
        for index in indices:
            old = table.blocks[index]
            new = self._pool.allocate(1)[0]
            # Only a block already holding this sequence's tokens needs its content copied; a shared
            # block not yet written (a contiguous reservation) is simply replaced.
            if index * self.block_size < table.num_tokens:
                self._copies.append((old, new))
            table.blocks[index] = new
            self._pool.release((old,))

    def take_block_copies(self) -> list[tuple[int, int]]:
        """Pending (src, dst) block copies; the backend must run them before the step's KV writes."""
        copies, self._copies = self._copies, []
        return copies

    def truncate(self, seq_id: int, num_tokens: int, token_ids: Sequence[int]) -> list[int]:
        """Cut the table back to its first `num_tokens` tokens (speculative tokens rejected): blocks past them go
        back to the pool, and blocks the kept tokens now fill are published, hashed from `token_ids`. Returns
        the table as it now is."""
        table = self._table(seq_id)
        if not 0 <= num_tokens <= table.num_tokens:
            raise ValueError(f"seq {seq_id}: cannot truncate {table.num_tokens} tokens to {num_tokens}")
        keep = self._blocks_to_cover(num_tokens)
        dropped = table.blocks[keep:]
        del table.blocks[keep:]
        del table.hashes[num_tokens // self.block_size :]
        table.num_tokens = num_tokens
        self._pool.release(reversed(self._live(dropped)))
        self._register_full_blocks(table, token_ids)
        return list(table.blocks)

    # --- sharing and release ---------------------------------------------------------------------

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent; the first write into a shared block copies it."""
        if child_id in self._tables:
            raise DuplicateSequenceError(f"sequence {child_id} already has a block table")
        table = self._table(parent_id).copy()
        self._pool.touch(self._live(table.blocks))
        self._tables[child_id] = table

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks, last block first: it is the least likely to be shared."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            raise UnknownSequenceError(seq_id)
        self._pool.release(reversed(self._live(table.blocks)))

    def reset_prefix_cache(self) -> None:
        self._pool.reset_hashes()

    # --- queries ---------------------------------------------------------------------------------

    def _table(self, seq_id: int) -> SeqTable:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id) from None

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._table(seq_id).blocks)

    def block_map(self) -> str:
        return self._pool.state_map()

    def cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """The longest cached prefix of a prompt: its blocks and their chain hashes."""
        return self._cached_prefix(token_ids)

    def num_tokens(self, seq_id: int) -> int:
        return self._table(seq_id).num_tokens

    def table_length(self, seq_id: int) -> int:
        return len(self._table(seq_id).blocks)

    def tokens_by_sequence(self) -> dict[int, int]:
        return {seq_id: table.num_tokens for seq_id, table in self._tables.items()}

    # One pool for every layer: no window pool (kvpool/hybrid.py has one).
    window_blocks = 0

    def window_table(self, seq_id: int) -> list[int]:
        return []

    def take_window_block_copies(self) -> list[tuple[int, int]]:
        return []

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._tables

    @property
    def max_sequence_tokens(self) -> int:
        """The most tokens one sequence can ever hold: the whole pool. Nothing is out of reach of a sequence
        running alone: free cached blocks are evicted for it, and the contiguous layout's reservation (never
        more than the pool) is its own table's first blocks, which grows past it like a paged one."""
        return self.num_blocks * self.block_size

    def stats(self) -> KVStats:
        pool = self._pool
        return KVStats.build(
            pool.num_blocks, pool.num_free(), pool.num_cached_free, self._counters, pool.evictions
        )

    @abstractmethod
    def check_invariants(self) -> None: ...


def _check_append(start: int, end: int) -> None:
    """An append outside the normal case: no tokens (nothing to do), or a caller bug."""
    if end < start:
        raise ValueError(f"{end - start} tokens after {start}")


def _check_token_count(token_ids: Sequence[int], num_tokens: int) -> None:
    if not 1 <= num_tokens <= len(token_ids):
        raise ValueError(f"num_tokens must be in [1, {len(token_ids)}], got {num_tokens}")
