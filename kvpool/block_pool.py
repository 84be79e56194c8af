"""Block ids, reference counts, the LRU free queue and the hash -> block map of cached full blocks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvpool.errors import KVInvariantError, NoFreeBlocksError
from kvpool.free_queue import FreeBlockQueue

_STATE_OF_REF = b".u" + b"s" * 254  # a block's state_map character by its reference count
_CACHED = ord("c")


@dataclass
class BlockPool:
    """Owns every block. A block is either free (ref 0, in the queue) or referenced by tables (ref > 0).

    A cached block keeps its hash while free, so a later prompt can revive it; it loses the hash
    (an eviction) only when the queue hands it out for new content.
    """

    num_blocks: int
    ref_counts: list[int]
    block_hashes: list[bytes | None]
    free_queue: FreeBlockQueue
    cached: dict[bytes, int] = field(default_factory=dict)
    num_cached_free: int = 0  # free blocks that still hold a hash (evictable cache)
    evictions: int = 0

    @classmethod
    def create(cls, num_blocks: int) -> BlockPool:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        return cls(num_blocks, [0] * num_blocks, [None] * num_blocks, FreeBlockQueue.of(range(num_blocks)))

    def num_free(self) -> int:
        return len(self.free_queue)

    def num_free_among(self, block_ids: Iterable[int]) -> int:
        """How many of these (cached) blocks sit in the free queue: reviving them costs free capacity."""
        return sum(1 for b in block_ids if self.ref_counts[b] == 0)

    def allocate(self, count: int) -> list[int]:
        """Hand out `count` blocks from the head of the queue with ref 1, evicting their old hashes."""
        if count > len(self.free_queue):
            raise NoFreeBlocksError(f"need {count} blocks, {len(self.free_queue)} free")
        blocks = self.free_queue.popleft_many(count)
        hashes, refs = self.block_hashes, self.ref_counts
        for block in blocks:
            if hashes[block] is not None:
                self._evict(block)
            refs[block] = 1
        return blocks

    def allocate_one(self) -> int:
        """allocate(1)[0] without the list: a decode token's new block. Callers check the queue is not empty."""
        block = self.free_queue.popleft()
        if self.block_hashes[block] is not None:
            self._evict(block)
        self.ref_counts[block] = 1
        return block

    def touch(self, block_ids: Iterable[int]) -> None:
        """One more reference to each block; a free cached block leaves the queue (revived)."""
        for block in block_ids:
            if self.ref_counts[block] == 0:
                self.free_queue.remove(block)
                self.num_cached_free -= self.block_hashes[block] is not None
            self.ref_counts[block] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the order given (callers pass tails first)."""
        refs, hashes, queue = self.ref_counts, self.block_hashes, self.free_queue
        for block in block_ids:
            count = refs[block] - 1
            if count < 0:
                raise KVInvariantError(f"block {block} released while already free")
            refs[block] = count
            if count:
                continue
            queue[block] = None  # FreeBlockQueue.append, inlined: this loop runs once per freed block
            if hashes[block] is None:  # nothing reusable in it: hand it out first, cached ones live longer
                queue.move_to_end(block, last=False)
            else:
                self.num_cached_free += 1

    def lookup(self, block_hash: bytes) -> int | None:
        return self.cached.get(block_hash)

    def register(self, block: int, block_hash: bytes) -> None:
        """Publish a just-filled block under its hash.

        If an identical block is cached and free, the hash moves to this one (in use, so it outlives
        the free copy, which becomes a plain free block); if that block is in use, this copy stays private.
        """
        existing = self.cached.get(block_hash)
        if existing is not None:
            if self.ref_counts[existing] > 0:
                return
            self._unhash_free(existing)
        self.cached[block_hash] = block
        self.block_hashes[block] = block_hash

    def _unhash_free(self, block: int) -> None:
        self.block_hashes[block] = None
        self.num_cached_free -= 1
        self.free_queue.remove(block)
        self.free_queue.appendleft(block)

    def _evict(self, block: int) -> None:
        block_hash = self.block_hashes[block]
        assert block_hash is not None
        del self.cached[block_hash]
        self.block_hashes[block] = None
        self.num_cached_free -= 1
        self.evictions += 1

    def state_map(self) -> str:
        """One character per block id, in order: '.' free, 'c' free holding a cached prefix (reusable), 'u' used
        by one table, 's' shared by several. What the live dashboard draws: O(blocks), built only when asked."""
        refs = self.ref_counts
        try:
            states = bytearray(bytes(refs).translate(_STATE_OF_REF))  # C speed: a ref count per byte
        except ValueError:  # a block in 256 tables or more
            states = bytearray(bytes(min(ref, 255) for ref in refs).translate(_STATE_OF_REF))
        for block in self.cached.values():  # exactly the blocks that hold a hash
            if not refs[block]:
                states[block] = _CACHED
        return states.decode("ascii")

    def reset_hashes(self) -> None:
        """Forget every cached prefix; blocks in use keep their content but can no longer be hit."""
        for block in self.cached.values():
            self.block_hashes[block] = None
        self.cached.clear()
        self.num_cached_free = 0
