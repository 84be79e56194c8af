"""Hash chains for automatic prefix caching.

A full block's hash is H(parent hash || its token ids || extra key), so equal hashes mean equal whole
prefixes. SHA-256 is collision resistant, so a hit needs no token comparison; it is also the
cheapest hashlib digest per small message here (OpenSSL, with SHA extensions on current x86 CPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from struct import Struct

DIGEST_SIZE = 32  # SHA-256


@dataclass(frozen=True)
class BlockHasher:
    block_size: int
    extra_key: bytes = b""  # e.g. the model name: caches of different models never mix
    root: bytes = bytes(DIGEST_SIZE)  # parent hash of a sequence's first block
    # Packs one block's token ids as little-endian int64: faster than array().tobytes() per block.
    _tokens: Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tokens", Struct(f"<{self.block_size}q"))

    def hash_block(self, parent: bytes, tokens: Sequence[int]) -> bytes:
        # Fixed-width fields (32-byte parent, block_size int64 tokens, then the manager's fixed
        # extra key) make the encoding unambiguous.
        data = parent + self._tokens.pack(*tokens) + self.extra_key
        return sha256(data).digest()

    def chain_next(self, hashes: Sequence[bytes], token_ids: Sequence[int]) -> bytes:
        """Hash of block len(hashes), chained onto the hashes of the blocks before it."""
        parent = hashes[-1] if hashes else self.root
        start = len(hashes) * self.block_size
        return self.hash_block(parent, token_ids[start : start + self.block_size])

    def extend_chain(self, hashes: Sequence[bytes], token_ids: Sequence[int], count: int) -> list[bytes]:
        """Hashes of the `count` blocks after `hashes` (hash_block inlined: once per filled block)."""
        size, pack, extra = self.block_size, self._tokens.pack, self.extra_key
        parent = hashes[-1] if hashes else self.root
        chain = []
        for start in range(len(hashes) * size, (len(hashes) + count) * size, size):
            parent = sha256(parent + pack(*token_ids[start : start + size]) + extra).digest()
            chain.append(parent)
        return chain
