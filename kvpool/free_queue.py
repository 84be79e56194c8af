"""The free-block queue: LRU order, O(1) pop from the head and O(1) removal from the middle."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class FreeBlockQueue(OrderedDict[int, None]):
    """Free block ids, head = next to hand out (least recently used), tail = most recently freed.

    OrderedDict is a C-implemented hash map threaded by a doubly linked list: popping the head,
    appending at either end and deleting any id are all O(1), with no Python-level node per block;
    len() and `in` stay C calls on the hot path.
    """

    @classmethod
    def of(cls, block_ids: Iterable[int]) -> FreeBlockQueue:
        return cls((block_id, None) for block_id in block_ids)

    def popleft(self) -> int:
        """The least recently freed block; callers check len() first."""
        return self.popitem(last=False)[0]

    def popleft_many(self, count: int) -> list[int]:
        popitem = self.popitem
        return [popitem(False)[0] for _ in range(count)]

    def append(self, block_id: int) -> None:
        """Freed block worth keeping (it holds a cached prefix): handed out last."""
        self[block_id] = None

    def appendleft(self, block_id: int) -> None:
        """Freed block with nothing reusable in it: handed out first."""
        self[block_id] = None
        self.move_to_end(block_id, last=False)

    def remove(self, block_id: int) -> None:
        del self[block_id]
