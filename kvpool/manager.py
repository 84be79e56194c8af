"""KVCacheManager: the scheduler's one interface to KV blocks, and the only writer of block tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.block_pool import BlockPool
from kvpool.config import KV_LAYOUTS, KVPoolConfig
from kvpool.errors import DuplicateSequenceError, NoFreeBlocksError, UnknownSequenceError
from kvpool.invariants import check_all
from kvpool.prefix_cache import BlockHasher
from kvpool.sizing import KVSpec, parse_size
from kvpool.stats import KVStats, PrefixCounters
from kvpool.table import SeqTable, blocks_for, slots_for


@dataclass(frozen=True)
class Allocation:
    num_cached_tokens: int  # tokens [0, num_cached_tokens) already have KV from the prefix cache
    slots: list[int]  # slot ids of tokens [num_cached_tokens, covered tokens)


class KVCacheManager:
    """Per-sequence block tables over a shared BlockPool, with prefix caching and copy-on-write forks."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        kv_layout: str = "paged",
        max_model_len: int = 8192,
        extra_key: bytes = b"",
    ) -> None:
        _validate_args(block_size, kv_layout, max_model_len)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_layout = kv_layout
        self.max_model_len = max_model_len
        # The contiguous baseline models a cache without paging, so it shares nothing.
        self.enable_prefix_caching = enable_prefix_caching and kv_layout == "paged"
        self._reserve = blocks_for(max_model_len, block_size) if kv_layout == "contiguous" else 0
        if self._reserve > num_blocks:
            raise ValueError(f"contiguous layout reserves {self._reserve} blocks, pool has {num_blocks}")
        self._pool = BlockPool.create(num_blocks)
        self._hasher = BlockHasher(block_size, extra_key)
        self._tables: dict[int, SeqTable] = {}
        self._copies: list[tuple[int, int]] = []
        self._counters = PrefixCounters()

    @classmethod
    def from_config(
        cls, config: KVPoolConfig, spec: KVSpec, max_model_len: int, extra_key: bytes = b""
    ) -> KVCacheManager:
        if spec.block_size != config.block_size:
            raise ValueError(f"KVSpec.block_size {spec.block_size} != config block_size {config.block_size}")
        num_blocks = config.num_blocks
        if num_blocks is None:
            num_blocks = spec.num_blocks_for(parse_size(config.kv_cache_memory))
        return cls(
            num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_layout=config.kv_layout,
            max_model_len=max_model_len,
            extra_key=extra_key,
        )

    # --- admission -------------------------------------------------------------------------------

    def num_cached_tokens(self, token_ids: Sequence[int]) -> int:
        return len(self._cached_prefix(token_ids)[0]) * self.block_size

    def can_allocate(self, token_ids: Sequence[int], num_tokens: int) -> bool:
        _check_token_count(token_ids, num_tokens)
        return self._fits_admission(self._cached_prefix(token_ids)[0], num_tokens)

    def allocate(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> Allocation:
        """Table for a new sequence: the cached prefix first, then new blocks up to num_tokens tokens.

        The table covers max(num_tokens, cached tokens). Raises NoFreeBlocksError with state unchanged.
        """
        if seq_id in self._tables:
            raise DuplicateSequenceError(f"sequence {seq_id} already has a block table")
        _check_token_count(token_ids, num_tokens)
        cached, hashes = self._cached_prefix(token_ids)
        if not self._fits_admission(cached, num_tokens):
            raise NoFreeBlocksError(f"sequence {seq_id}: not enough free blocks for {num_tokens} tokens")
        num_new = self._admission_need(cached, num_tokens)
        self._pool.touch(cached)  # revive cached blocks before allocate() could evict them
        cached_tokens = len(cached) * self.block_size
        table = SeqTable(cached + self._pool.allocate(num_new), max(num_tokens, cached_tokens), hashes)
        self._tables[seq_id] = table
        self._register_full_blocks(table, token_ids)
        self._counters.record(len(token_ids), cached_tokens)
        slots = slots_for(table.blocks, self.block_size, cached_tokens, table.num_tokens)
        return Allocation(cached_tokens, slots)

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Blocks and chain hashes of the longest cached full-block prefix, leaving the last token out."""
        blocks: list[int] = []
        hashes: list[bytes] = []
        if not self.enable_prefix_caching:
            return blocks, hashes
        for _ in range((len(token_ids) - 1) // self.block_size):
            block_hash = self._hasher.chain_next(hashes, token_ids)
            block = self._pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return blocks, hashes

    def _admission_need(self, cached: list[int], num_tokens: int) -> int:
        """New blocks an admission takes besides the cached ones."""
        covered = max(num_tokens, len(cached) * self.block_size)
        return max(self._reserve, blocks_for(covered, self.block_size)) - len(cached)

    def _fits_admission(self, cached: list[int], num_tokens: int) -> bool:
        # Reviving a free cached block takes it out of the free queue, so it is not free capacity.
        available = self._pool.num_free() - self._pool.num_free_among(cached)
        return self._admission_need(cached, num_tokens) <= available

    # --- running sequences -----------------------------------------------------------------------

    def can_append(self, seq_id: int, num_new_tokens: int) -> bool:
        table = self._table(seq_id)
        if num_new_tokens <= 0:
            return True
        end = table.num_tokens + num_new_tokens
        need = self._growth(table, end) + len(self._shared_in_range(table, end))
        return need <= self._pool.num_free()

    def append_slots(self, seq_id: int, token_ids: Sequence[int], num_new_tokens: int) -> list[int] | None:
        """Slots of the next num_new_tokens tokens, growing (and un-sharing) the table; None if no blocks."""
        table = self._table(seq_id)
        start = table.num_tokens
        if not self._append(table, token_ids, start + num_new_tokens, 0, []):
            return None
        return slots_for(table.blocks, self.block_size, start, table.num_tokens)

    def append_many(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
                    changes: list[tuple[int, int, int]], first: int = 0) -> int:
        """append_slots for seq_ids[first:] in turn (counts[i] more tokens each): one engine step's appends.

        Stops at the first sequence that cannot get its blocks, leaving its table as it was, and returns its
        index (len(seq_ids) when all got theirs). Rather than slots, it reports each table entry it sets, as
        (index into seq_ids, block index, block id) in `changes`, so a caller keeping a copy of the tables
        patches only those; a token's slot is then table[pos // block_size] * block_size + pos % block_size.
        """
        tables, refs, size, free = self._tables, self._pool.ref_counts, self.block_size, self._pool.free_queue
        paged, caching = not self._reserve, self.enable_prefix_caching
        for i in range(first, len(seq_ids)):
            table = tables.get(seq_ids[i]) or self._table(seq_ids[i])
            start = table.num_tokens
            # Decode tokens first: one more token into the partly written block this table owns alone, the
            # usual case, or into a new block.
            if paged and counts[i] == 1 and start % size and refs[table.blocks[-1]] == 1:
                table.num_tokens = start + 1
                if caching and not (start + 1) % size:
                    self._register_next_block(table, token_ids[i])
            elif paged and counts[i] == 1 and not start % size and free:
                self._append_block(table, token_ids[i], i, changes)
            elif not self._append(table, token_ids[i], start + counts[i], i, changes):
                return i
        return len(seq_ids)

    def _append_block(self, table: SeqTable, token_ids: Sequence[int], index: int,
                      changes: list[tuple[int, int, int]]) -> None:
        """A decode token that starts a new block (paged, the table full)."""
        block = self._pool.allocate_one()
        changes.append((index, len(table.blocks), block))
        table.blocks.append(block)
        table.num_tokens += 1
        if self.enable_prefix_caching and table.num_tokens // self.block_size > len(table.hashes):
            self._register_full_blocks(table, token_ids)

    def _append(self, table: SeqTable, token_ids: Sequence[int], end: int, index: int,
                changes: list[tuple[int, int, int]]) -> bool:
        """Cover tokens up to `end`, recording changed entries as (index, block index, block id)."""
        if end <= table.num_tokens or len(token_ids) < end:
            _check_append(table.num_tokens, end, len(token_ids))
            return True
        if not self._fits_in_place(table, end):
            changed = self._make_room(table, end)
            if changed is None:
                return False
            changes.extend((index, j, table.blocks[j]) for j in changed)
        table.num_tokens = end
        if self.enable_prefix_caching and end // self.block_size > len(table.hashes):
            self._register_full_blocks(table, token_ids)
        return True

    def _fits_in_place(self, table: SeqTable, end: int) -> bool:
        """Tokens up to `end` land in blocks this table already owns alone: the common decode step."""
        if end > len(table.blocks) * self.block_size:
            return False
        if self._reserve:
            return not self._shared_in_range(table, end)
        # Paged tables end at the partly written block, so it is the only one written.
        return self._pool.ref_counts[table.blocks[table.num_tokens // self.block_size]] == 1

    def _make_room(self, table: SeqTable, end: int) -> list[int] | None:
        """Un-share and grow the table to cover `end`, returning the table indices it set; or change nothing
        and return None."""
        grow = self._growth(table, end)
        shared = self._shared_in_range(table, end)
        if grow + len(shared) > len(self._pool.free_queue):
            return None
        if shared:
            self._copy_on_write(table, shared)
        if grow:
            table.blocks.extend(self._pool.allocate(grow))
        return shared + list(range(len(table.blocks) - grow, len(table.blocks)))

    def _growth(self, table: SeqTable, end: int) -> int:
        """New blocks the table needs to cover `end` tokens."""
        return max(0, -(-end // self.block_size) - len(table.blocks))

    def _shared_in_range(self, table: SeqTable, end: int) -> list[int]:
        """Table indices of shared blocks that tokens [table.num_tokens, end) would write into."""
        blocks, refs = table.blocks, self._pool.ref_counts
        first = table.num_tokens // self.block_size
        if not self._reserve:  # paged: only the partly written last block can exist and be shared
            return [first] if first < len(blocks) and refs[blocks[first]] > 1 else []
        last = min(-(-end // self.block_size), len(blocks))
        return [i for i in range(first, last) if refs[blocks[i]] > 1]

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

    def _register_full_blocks(self, table: SeqTable, token_ids: Sequence[int]) -> None:
        """Hash every block that has become full and publish it in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        done = len(table.hashes)
        count = table.num_tokens // self.block_size - done
        new_hashes = self._hasher.extend_chain(table.hashes, token_ids, count)
        register, blocks = self._pool.register, table.blocks
        for index, block_hash in enumerate(new_hashes, done):
            register(blocks[index], block_hash)
        table.hashes.extend(new_hashes)

    def _register_next_block(self, table: SeqTable, token_ids: Sequence[int]) -> None:
        """_register_full_blocks for the one block a decode token just filled."""
        block_hash = self._hasher.chain_next(table.hashes, token_ids)
        self._pool.register(table.blocks[len(table.hashes)], block_hash)
        table.hashes.append(block_hash)

    def take_block_copies(self) -> list[tuple[int, int]]:
        """Pending (src, dst) block copies; the backend must run them before the step's KV writes."""
        copies, self._copies = self._copies, []
        return copies

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent; the first write into a shared block copies it."""
        if child_id in self._tables:
            raise DuplicateSequenceError(f"sequence {child_id} already has a block table")
        table = self._table(parent_id).copy()
        self._pool.touch(table.blocks)
        self._tables[child_id] = table

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks, last block first: it is the least likely to be shared."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            raise UnknownSequenceError(seq_id)
        self._pool.release(reversed(table.blocks))

    # --- queries ---------------------------------------------------------------------------------

    def _table(self, seq_id: int) -> SeqTable:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id) from None

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._table(seq_id).blocks)

    def num_tokens(self, seq_id: int) -> int:
        return self._table(seq_id).num_tokens

    def has_sequence(self, seq_id: int) -> bool:
        return seq_id in self._tables

    @property
    def max_sequence_tokens(self) -> int:
        """The most tokens one sequence can ever hold: the whole pool. Nothing is out of reach of a sequence
        running alone: free cached blocks are evicted for it, and the contiguous layout's reservation (never
        more than the pool) is its own table's first blocks, which grows past it like a paged one."""
        return self.num_blocks * self.block_size

    def num_free_blocks(self) -> int:
        return self._pool.num_free()

    def stats(self) -> KVStats:
        pool = self._pool
        return KVStats.build(
            pool.num_blocks, pool.num_free(), pool.num_cached_free, self._counters, pool.evictions
        )

    def reset_prefix_cache(self) -> None:
        self._pool.reset_hashes()

    def check_invariants(self) -> None:
        caching, reserve = self.enable_prefix_caching, self._reserve
        check_all(self._pool, self._tables, self._copies, self.block_size, caching, reserve)


def _validate_args(block_size: int, kv_layout: str, max_model_len: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")


def _check_append(start: int, end: int, num_known: int) -> None:
    """append_slots outside the normal case: no tokens (nothing to do), or a caller bug."""
    if end < start or num_known < end:
        raise ValueError(f"{end - start} tokens after {start}, {num_known} known")


def _check_token_count(token_ids: Sequence[int], num_tokens: int) -> None:
    if not 1 <= num_tokens <= len(token_ids):
        raise ValueError(f"num_tokens must be in [1, {len(token_ids)}], got {num_tokens}")
