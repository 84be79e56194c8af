"""The one frozen configuration of the KV pool."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.sizing import parse_size

KV_LAYOUTS = ("paged", "contiguous")


@dataclass(frozen=True)
class KVPoolConfig:
    block_size: int = 16
    kv_cache_memory: str = "2GiB"  # parsed by parse_size
    num_blocks: int | None = None  # overrides the memory budget when set
    enable_prefix_caching: bool = True
    kv_layout: str = "paged"  # "paged" | "contiguous"

    def __post_init__(self) -> None:
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {self.kv_layout!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 when set, got {self.num_blocks}")
        parse_size(self.kv_cache_memory)  # fail at config time, not at engine start
