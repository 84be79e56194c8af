"""KVCacheManager: everything the scheduler and the service call on the KV pool, whatever its layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvpool.stats import KVStats

# One block table entry an append set: (index into its seq_ids, block index, block id, group). Group 0 is the
# table every layer reads, or the full-attention layers' where the sliding layers have a pool of their own (group
# 1, see kvpool/hybrid.py); a block id of -1 there is a block given back from behind the window.
TableChange = tuple[int, int, int, int]


class KVCacheManager(Protocol):
    """Per-sequence block tables over one pool of `num_blocks` blocks of `block_size` tokens: a
    PagedKVCacheManager, or the ContiguousKVCacheManager baseline (kvpool.build picks one from the configured layout).

    - `allocate()` admits a sequence (its cached prefix first) and returns how many of its tokens the prefix
      cache served; `can_allocate()` says whether it would succeed, `num_cached_tokens()` what it would serve.
    - `append()` covers one step's new tokens for many sequences in turn; see PagedKVCacheManager.append. A
      count may reach past the tokens known (speculative tokens): blocks are published in the prefix cache only
      once the tokens they hold are known, and `truncate()` gives back the slots of those rejected.
    - `take_block_copies()`: the (src, dst) copies that forks' copy-on-write queued; the backend runs them
      before the step's KV writes (`take_window_block_copies()`: those in the sliding layers' pool).
    - `window_blocks`, `window_table()`: where the sliding-window layers keep their KV in a pool of their own
      (HybridKVCacheManager), its size and each sequence's table there, which `append` reports as group 1.
    - `fork()` shares a table with a new sequence; `free()` gives a table's blocks back.
    - `block_map()` is every block's state, for the live dashboard and /metrics' cached and shared counts;
    - `stats()` is the read-only snapshot metrics read; `check_invariants()` checks the bookkeeping, O(blocks).
    """

    @property
    def block_size(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def max_sequence_tokens(self) -> int: ...

    @property
    def window_blocks(self) -> int:
        """Blocks of the sliding layers' own pool (kvpool/hybrid.py); 0: every layer's KV is in the one pool."""
        ...

    def window_table(self, seq_id: int) -> list[int]:
        """The sliding layers' table of a sequence where they have a pool of their own (-1: given back)."""
        ...

    def take_window_block_copies(self) -> list[tuple[int, int]]: ...

    def num_cached_tokens(self, token_ids: Sequence[int]) -> int: ...

    def can_allocate(self, token_ids: Sequence[int], num_tokens: int) -> bool: ...

    def allocate(self, seq_id: int, token_ids: Sequence[int], num_tokens: int) -> int: ...

    def append(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], counts: Sequence[int],
               start: int = 0) -> tuple[int, list[TableChange]]: ...

    def truncate(self, seq_id: int, num_tokens: int, token_ids: Sequence[int]) -> list[int]: ...

    def take_block_copies(self) -> list[tuple[int, int]]: ...

    def fork(self, parent_id: int, child_id: int) -> None: ...

    def free(self, seq_id: int) -> None: ...

    def has_sequence(self, seq_id: int) -> bool: ...

    def block_table(self, seq_id: int) -> list[int]: ...

    def block_map(self) -> str:
        """Each block's state, one character per block id: see BlockPool.state_map."""
        ...

    def reset_prefix_cache(self) -> None: ...

    def stats(self) -> KVStats: ...

    def check_invariants(self) -> None: ...
