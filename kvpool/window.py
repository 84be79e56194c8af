"""WindowTables: the block tables of sliding-window layers, which give back the blocks behind their window."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.errors import KVInvariantError
from kvpool.invariants import check_all
from kvpool.manager import TableChange
from kvpool.paged import PagedKVCacheManager
from kvpool.table import SeqTable

NO_BLOCK = -1  # a table entry given back: the block lay wholly before the window, and nothing reads it again


class WindowTables(PagedKVCacheManager):
    """Paged tables for layers whose query at position p sees only positions p - window + 1 .. p.

    Before a table grows, it gives back the blocks that lie wholly before the window of the step's first query
    (at the table's token count: no later query reads further back); their entries become NO_BLOCK, and the
    changes say so. A table so holds at most kvpool.sizing.window_table_blocks(window, block_size, n) blocks while
    a step computes n of its tokens. A block given back keeps its prefix-cache hash while free, as any freed block
    does, so a later prompt can find its prefix's window here (`cached_window`); a block is given back only once
    it is hashed.
    """

    group = 1

    def __init__(self, num_blocks: int, block_size: int, window: int, *, enable_prefix_caching: bool = True,
                 extra_key: bytes = b"") -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching, extra_key=extra_key)
        self.window = window


    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]:
        """PagedKVCacheManager.append, after each table has given back what lies behind its window. A table
        that then cannot grow keeps what it gave back: that was behind the window whatever comes next."""
        changes: list[TableChange] = []
        tables, size, reach = self._tables, self.block_size, self.window - 1
        for i in range(start, len(seq_ids)):  # once per sequence and step: the test inlined
            table = tables.get(seq_ids[i]) or self._table(seq_ids[i])
            if (table.num_tokens - reach) // size > table.dead:
                self._give_back(table, i, changes)
        done, grown = super().append(seq_ids, token_ids, counts, start)
        return done, changes + grown

    def _give_back(self, table: SeqTable, index: int, changes: list[TableChange]) -> None:
        dead = self._first_needed(table)
        if dead <= table.dead:
            return
        blocks = table.blocks
        gone = blocks[table.dead : dead]
        for j in range(table.dead, dead):
            blocks[j] = NO_BLOCK
            changes.append((index, j, NO_BLOCK, self.group))
        table.dead = dead
        self._pool.release(gone)  # oldest first: the cache evicts them first among these

    def _first_needed(self, table: SeqTable) -> int:
        """The first block a query at the table's token count can read; never past its hashed blocks, so that a
        block is in the prefix cache before it is given back."""
        first = max(0, table.num_tokens - self.window + 1) // self.block_size
        return min(first, len(table.hashes)) if self._caching else first

    @staticmethod
    def _live(blocks: list[int]) -> list[int]:
        return [b for b in blocks if b != NO_BLOCK]

    # --- the prefix cache ------------------------------------------------------------------------

    def cached_window(self, hashes: Sequence[bytes]) -> int:
        """The longest prefix of these chained full blocks, k of them, whose window is cached here: the blocks a
        query at position k * block_size reads, (k * block_size - window + 1) // block_size .. k - 1."""
        lookup = self._pool.lookup
        run = 0  # cached blocks in a row, ending at block k - 1
        best = 0
        for k, block_hash in enumerate(hashes, 1):
            run = run + 1 if lookup(block_hash) is not None else 0
            if run >= k - self._window_start(k):
                best = k
        return best

    def window_prefix(self, hashes: Sequence[bytes], k: int) -> list[int]:
        """The table entries of the first k blocks for a new sequence: NO_BLOCK before their window, then the
        cached blocks (cached_window(hashes) >= k)."""
        first = self._window_start(k)
        cached = [self._pool.lookup(h) for h in hashes[first:k]]
        assert all(b is not None for b in cached), "window_prefix past cached_window"
        return [NO_BLOCK] * first + [b for b in cached if b is not None]

    def _window_start(self, k: int) -> int:
        return max(0, k * self.block_size - self.window + 1) // self.block_size

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """The longest prefix whose window is cached (used alone; kvpool/hybrid.py looks it up with the full
        layers' tables)."""
        if not self._caching:
            return [], []
        hashes = self._hasher.extend_chain([], token_ids, (len(token_ids) - 1) // self.block_size)
        k = self.cached_window(hashes)
        return self.window_prefix(hashes, k), hashes[:k]

    def admit(self, seq_id: int, token_ids: Sequence[int], num_tokens: int, cached: list[int],
              hashes: list[bytes]) -> int:
        served = super().admit(seq_id, token_ids, num_tokens, cached, hashes)
        table = self._tables[seq_id]
        table.dead = next((j for j, b in enumerate(table.blocks) if b != NO_BLOCK), len(table.blocks))
        return served

    def truncate(self, seq_id: int, num_tokens: int, token_ids: Sequence[int]) -> list[int]:
        if self._blocks_to_cover(num_tokens) < self._table(seq_id).dead:
            raise ValueError(f"seq {seq_id}: cannot truncate to {num_tokens} tokens, behind its window")
        return super().truncate(seq_id, num_tokens, token_ids)

    def check_invariants(self) -> None:
        check_all(self._pool, self._tables, self._copies, self.block_size, self._caching, reserve=0)
        for seq_id, table in self._tables.items():
            head, rest = table.blocks[: table.dead], table.blocks[table.dead :]
            if any(b != NO_BLOCK for b in head) or NO_BLOCK in rest:
                raise KVInvariantError(f"seq {seq_id}: given-back entries {table.blocks} do not end at {table.dead}")
            if table.dead > max(0, table.num_tokens - self.window + 1) // self.block_size:
                raise KVInvariantError(f"seq {seq_id}: gave back {table.dead} blocks, inside its window")
