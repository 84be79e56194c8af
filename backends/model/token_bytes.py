"""Each token id's bytes, packed: one bytes object and the offsets into it. Gemma 3's 262,144 tokens as a tuple of
bytes objects took 12 MiB (33 bytes of object header each, for pieces of 6 bytes on average); packed, 2.7 MiB."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class TokenBytes(Sequence[bytes]):
    """An immutable sequence of bytes, indexed by token id."""

    __slots__ = ("_data", "_ends")

    def __init__(self, pieces: Iterable[bytes]) -> None:
        """Each piece is appended as it comes: no list of them is held (their garbage would stay in the heap)."""
        data, ends = bytearray(), array("I")
        for piece in pieces:
            data += piece
            ends.append(len(data))
        self._data, self._ends = bytes(data), ends

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        at = index + len(self._ends) if index < 0 else index
        if not 0 <= at < len(self._ends):
            raise IndexError("token id out of range")
        return self._data[self._ends[at - 1] if at else 0 : self._ends[at]]

    def __iter__(self) -> Iterator[bytes]:
        start = 0
        for end in self._ends:
            yield self._data[start:end]
            start = end

