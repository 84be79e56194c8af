"""Telemetry snapshot of the pool and the prefix-cache counters behind it."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass
class PrefixCounters:
    """Cumulative token counts (never reset, so they export as Prometheus counters)."""

    queries: int = 0
    hits: int = 0

    def record(self, queried_tokens: int, hit_tokens: int) -> None:
        self.queries += queried_tokens
        self.hits += hit_tokens


@dataclass(frozen=True)
class KVStats:
    num_blocks: int
    used_blocks: int  # referenced by at least one table
    cached_free_blocks: int  # free but still holding a reusable prefix (evictable)
    free_blocks: int  # all free blocks, cached ones included: used + free == num_blocks
    usage: float  # used_blocks / num_blocks
    prefix_queries: int  # prompt tokens looked up at admission
    prefix_hits: int  # of those, tokens served from the cache
    hit_rate: float  # prefix_hits / prefix_queries (0 before any query)
    evictions: int  # cached blocks whose hash was dropped to reuse the block
    # The sliding layers' own pool, where they have one (kvpool/hybrid.py; the fields above are the full layers')
    window_blocks: int = 0
    window_used_blocks: int = 0

    def with_window(self, num_blocks: int, used_blocks: int) -> KVStats:
        return replace(self, window_blocks=num_blocks, window_used_blocks=used_blocks)

    @classmethod
    def build(
        cls,
        num_blocks: int,
        free_blocks: int,
        cached_free_blocks: int,
        counters: PrefixCounters,
        evictions: int,
    ) -> KVStats:
        used = num_blocks - free_blocks
        return cls(
            num_blocks=num_blocks,
            used_blocks=used,
            cached_free_blocks=cached_free_blocks,
            free_blocks=free_blocks,
            usage=used / num_blocks,
            prefix_queries=counters.queries,
            prefix_hits=counters.hits,
            hit_rate=counters.hits / counters.queries if counters.queries else 0.0,
            evictions=evictions,
        )
