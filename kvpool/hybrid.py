"""HybridKVCacheManager: a model whose sliding-window layers keep their KV in a pool of their own."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.errors import DuplicateSequenceError, KVInvariantError, NoFreeBlocksError
from kvpool.manager import TableChange
from kvpool.paged import PagedKVCacheManager
from kvpool.stats import KVStats
from kvpool.window import WindowTables


class HybridKVCacheManager:
    """Two sets of tables per sequence, kept in step: the full-attention layers' over `full` (group 0, what
    `block_table`, `num_blocks` and the stats describe) and the sliding layers' over `window` (group 1), which
    gives back what falls behind the window, so a long sequence costs the sliding layers a window's blocks only.

    A sequence is admitted, grows, forks, is cut back and freed in both or in neither. A prompt's cached prefix is
    the longest one whose full-layer blocks are all cached and whose window's blocks are cached in `window`.
    """

    def __init__(self, full: PagedKVCacheManager, window: WindowTables) -> None:
        if full.block_size != window.block_size:
            raise ValueError(f"block sizes differ: {full.block_size} and {window.block_size}")
        self.full, self.window = full, window

    @property
    def block_size(self) -> int:
        return self.full.block_size

    @property
    def num_blocks(self) -> int:
        return self.full.num_blocks

    @property
    def window_blocks(self) -> int:
        return self.window.num_blocks

    @property
    def max_sequence_tokens(self) -> int:
        return self.full.max_sequence_tokens  # the window pool holds one sequence's window and chunk (kvpool.build)

    # --- admission -------------------------------------------------------------------------------

    def _cached(self, token_ids: Sequence[int]) -> tuple[list[int], list[int], list[bytes]]:
        """The cached prefix both groups serve: the full layers' blocks, the window's entries, the chain hashes."""
        blocks, hashes = self.full.cached_prefix(token_ids)
        k = self.window.cached_window(hashes)
        return blocks[:k], self.window.window_prefix(hashes, k), hashes[:k]

    def num_cached_tokens(self, token_ids: Sequence[int]) -> int:
        return len(self._cached(token_ids)[0]) * self.block_size

    def can_allocate(self, token_ids: Sequence[int], num_tokens: int) -> bool:
        full, window, _ = self._cached(token_ids)
        return self._can_admit(token_ids, num_tokens, full, window)

    def _can_admit(self, token_ids: Sequence[int], num_tokens: int, full: list[int], window: list[int]) -> bool:
        if not 1 <= num_tokens <= len(token_ids):
            raise ValueError(f"num_tokens must be in [1, {len(token_ids)}], got {num_tokens}")
        return self.full.can_admit(full, num_tokens) and self.window.can_admit(window, num_tokens)

    def allocate(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> int:
        full, window, hashes = self._cached(token_ids)
        if self.full.has_sequence(seq_id) or not self._can_admit(token_ids, num_tokens, full, window):
            if self.full.has_sequence(seq_id):
                raise DuplicateSequenceError(f"sequence {seq_id} already has a block table")
            raise NoFreeBlocksError(f"sequence {seq_id}: not enough free blocks for {num_tokens} tokens")
        self.window.admit(seq_id, token_ids, num_tokens, window, list(hashes))  # each table extends its own list
        return self.full.admit(seq_id, token_ids, num_tokens, full, hashes)

    # --- growth ----------------------------------------------------------------------------------

    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]:
        """Both groups' appends: the window's first, then the full layers' over the sequences the window served.
        A sequence the full layers cannot serve has its window table cut back to where it was (what it gave back
        from behind the window stays given back), so the two stop at the same sequence."""
        served, window_changes = self.window.append(seq_ids, token_ids, counts, start)
        if served < len(seq_ids):  # the usual step serves all: no copies of its lists then
            seq_ids, token_ids, counts = seq_ids[:served], token_ids[:served], counts[:served]
        done, changes = self.full.append(seq_ids, token_ids, counts, start)
        if done == served:
            return done, changes + window_changes if window_changes else changes
        for i in range(done, served):  # each grew by its count in the window's tables
            self.window.truncate(seq_ids[i], self.window.num_tokens(seq_ids[i]) - counts[i], token_ids[i])
        kept = [c for c in window_changes  # those of the tables cut back, up to their length now
                if not done <= c[0] < served or c[1] < self.window.table_length(seq_ids[c[0]])]
        return done, changes + kept

    def truncate(self, seq_id: int, num_tokens: int, token_ids: Sequence[int]) -> list[int]:
        self.window.truncate(seq_id, num_tokens, token_ids)
        return self.full.truncate(seq_id, num_tokens, token_ids)

    def take_block_copies(self) -> list[tuple[int, int]]:
        return self.full.take_block_copies()

    def take_window_block_copies(self) -> list[tuple[int, int]]:
        return self.window.take_block_copies()

    # --- sharing and release ---------------------------------------------------------------------

    def fork(self, parent_id: int, child_id: int) -> None:
        self.full.fork(parent_id, child_id)
        self.window.fork(parent_id, child_id)

    def free(self, seq_id: int) -> None:
        self.full.free(seq_id)
        self.window.free(seq_id)

    def reset_prefix_cache(self) -> None:
        self.full.reset_prefix_cache()
        self.window.reset_prefix_cache()

    # --- queries ---------------------------------------------------------------------------------

    def has_sequence(self, seq_id: int) -> bool:
        return self.full.has_sequence(seq_id)

    def block_table(self, seq_id: int) -> list[int]:
        return self.full.block_table(seq_id)

    def window_table(self, seq_id: int) -> list[int]:
        return self.window.block_table(seq_id)

    def block_map(self) -> str:
        return self.full.block_map()

    def stats(self) -> KVStats:
        window = self.window.stats()
        return self.full.stats().with_window(window.num_blocks, window.used_blocks)

    def check_invariants(self) -> None:
        self.full.check_invariants()
        self.window.check_invariants()
        if self.full.tokens_by_sequence() != self.window.tokens_by_sequence():
            raise KVInvariantError("the full and window tables do not hold the same sequences and tokens")
