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
    # Blocks of the sliding-window layers' own pool (a model with both kinds of layer, paged layout); None: enough
    # for max_num_seqs windows and a step's chunks (kvpool.sizing.window_blocks_wanted)
    num_window_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_layout: str = "paged"  # "paged" | "contiguous"

    def __post_init__(self) -> None:
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {self.kv_layout!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("num_blocks", "num_window_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 when set, got {value}")
        parse_size(self.kv_cache_memory)  # fail at config time, not at engine start
