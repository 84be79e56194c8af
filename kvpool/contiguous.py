"""ContiguousKVCacheManager: the baseline without paging, which the benchmarks measure the paged layout against."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.block_tables import BlockTables
from kvpool.invariants import check_all
from kvpool.manager import TableChange
from kvpool.table import SeqTable, blocks_for


class ContiguousKVCacheManager(BlockTables):
    """Every sequence reserves max_model_len tokens of blocks at admission, as a cache without paging does, and
    nothing is shared through a prefix cache. A fork shares the whole reservation, so a write un-shares every
    block it touches (copying only those that already hold tokens). A table still grows past its reservation,
    as a paged one does, so a sequence running alone can use the whole pool."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        super().__init__(num_blocks, block_size)
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self._reserve = blocks_for(max_model_len, block_size)
        if self._reserve > num_blocks:
            raise ValueError(f"contiguous layout reserves {self._reserve} blocks, pool has {num_blocks}")

    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]:
        """As PagedKVCacheManager.append, without its decode shortcuts: a write may land in any reserved block."""
        changes: list[TableChange] = []
        for i in range(start, len(seq_ids)):
            table = self._table(seq_ids[i])
            if not self._append(table, token_ids[i], table.num_tokens + counts[i], i, changes):
                return i, changes
        return len(seq_ids), changes

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        return [], []  # nothing is shared: no prefix cache

    def _register_full_blocks(self, table: SeqTable, token_ids: Sequence[int]) -> None:
        pass

    def _blocks_to_cover(self, num_tokens: int) -> int:
        return max(self._reserve, blocks_for(num_tokens, self.block_size))

    def _shared_in_range(self, table: SeqTable, end: int) -> list[int]:
        blocks, refs = table.blocks, self._pool.ref_counts
        last = min(-(-end // self.block_size), len(blocks))
        return [i for i in range(table.num_tokens // self.block_size, last) if refs[blocks[i]] > 1]

    def check_invariants(self) -> None:
        check_all(self._pool, self._tables, self._copies, self.block_size, caching=False, reserve=self._reserve)
