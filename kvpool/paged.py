"""PagedKVCacheManager: blocks handed out as tokens fill them, shared through the prefix cache and forks."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.block_tables import BlockTables
from kvpool.invariants import check_all
from kvpool.manager import TableChange
from kvpool.prefix_cache import BlockHasher
from kvpool.table import SeqTable


class PagedKVCacheManager(BlockTables):
    """A table holds only the blocks its tokens fill, so it ends at its partly written block, the only block a
    write can find shared. With prefix caching, each block that fills is hashed and published, and a new prompt
    starts from the longest chain of published blocks it matches."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 extra_key: bytes = b"") -> None:
        super().__init__(num_blocks, block_size)
        self._caching = enable_prefix_caching
        self._hasher = BlockHasher(block_size, extra_key)

    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]:
        """Cover counts[i] more tokens of each sequence seq_ids[i] in turn, from `start`: one engine step's appends.

        counts[i] may reach past token_ids[i], the tokens known, by speculative tokens: the blocks they fill are
        not published in the prefix cache until truncate() says which were accepted.

        Stops at the first sequence that cannot get its blocks, leaving its table as it was, and returns its index
        (len(seq_ids) when all got theirs) with each table entry set on the way, as (index into seq_ids, block
        index, block id): a caller keeping a copy of the tables patches only those, and resumes from that index
        once it has freed blocks. A token's slot is table[pos // block_size] * block_size + pos % block_size.
        """
        tables, refs, size, free = self._tables, self._pool.ref_counts, self.block_size, self._pool.free_queue
        caching = self._caching
        changes: list[TableChange] = []
        for i in range(start, len(seq_ids)):
            table = tables.get(seq_ids[i]) or self._table(seq_ids[i])
            num = table.num_tokens
            # Decode tokens first: one more token into the partly written block this table owns alone, the
            # usual case, or into a new block.
            if counts[i] == 1 and num % size and refs[table.blocks[-1]] == 1:
                table.num_tokens = num + 1
                if caching and not (num + 1) % size:
                    self._register_next_block(table, token_ids[i])
            elif counts[i] == 1 and not num % size and free:
                self._append_block(table, token_ids[i], i, changes)
            elif not self._append(table, token_ids[i], num + counts[i], i, changes):
                return i, changes
        return len(seq_ids), changes

    def _append_block(self, table: SeqTable, token_ids: Sequence[int], index: int, changes: list[TableChange]
                      ) -> None:
        """A decode token that starts a new block (the table full)."""
        block = self._pool.allocate_one()
        changes.append((index, len(table.blocks), block, self.group))
        table.blocks.append(block)
        table.num_tokens += 1
        if self._caching and table.num_tokens // self.block_size > len(table.hashes):  # block_size 1: full now
            self._register_full_blocks(table, token_ids)

    def _shared_in_range(self, table: SeqTable, end: int) -> list[int]:
        # Only the partly written last block can exist in the range and be shared.
        first = table.num_tokens // self.block_size
        blocks = table.blocks
        return [first] if first < len(blocks) and self._pool.ref_counts[blocks[first]] > 1 else []

    def check_invariants(self) -> None:
        check_all(self._pool, self._tables, self._copies, self.block_size, self._caching, reserve=0)

    # --- prefix cache ----------------------------------------------------------------------------

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Blocks and chain hashes of the longest cached full-block prefix, leaving the last token out."""
        blocks: list[int] = []
        hashes: list[bytes] = []
        if not self._caching:
            return blocks, hashes
        for _ in range((len(token_ids) - 1) // self.block_size):
            block_hash = self._hasher.chain_next(hashes, token_ids)
            block = self._pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
        return blocks, hashes

    def _register_full_blocks(self, table: SeqTable, token_ids: Sequence[int]) -> None:
        """Hash every block that has become full of known tokens and publish it in the prefix cache (a block
        holding speculative tokens, past `token_ids`, waits until they are accepted: see truncate())."""
        done = len(table.hashes)
        count = min(table.num_tokens, len(token_ids)) // self.block_size - done
        if not self._caching or count <= 0:
            return
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
