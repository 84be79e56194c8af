"""A sequence's block table and the slot arithmetic over it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SeqTable:
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens the table covers (slots handed out so far)
    hashes: list[bytes] = field(default_factory=list)  # chain hashes of its full blocks (when caching)
    dead: int = 0  # leading entries given back (-1) from behind a sliding window (kvpool/window.py)

    def copy(self) -> SeqTable:
        return SeqTable(list(self.blocks), self.num_tokens, list(self.hashes), self.dead)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def slots_for(blocks: list[int], block_size: int, start: int, end: int) -> list[int]:
    """Slot ids (block_id * block_size + offset) of token positions [start, end)."""
    if end - start == 1:  # the decode step
        return [blocks[start // block_size] * block_size + start % block_size]
    if start >= end:
        return []
    index, offset = divmod(start, block_size)
    if offset + end - start <= block_size:  # within one block, e.g. an aligned 16-token chunk
        base = blocks[index] * block_size
        return list(range(base + offset, base + offset + end - start))
    slots: list[int] = []
    pos = start
    while pos < end:
        index, offset = divmod(pos, block_size)
        base = blocks[index] * block_size
        stop = min(end - pos, block_size - offset)
        slots.extend(range(base + offset, base + offset + stop))
        pos += stop
    return slots
