"""HybridKVCacheManager: the sliding-window layers' tables over a pool of their own, which give back the blocks
behind the window, kept in step with the full layers' tables (kvpool/hybrid.py, kvpool/window.py).

The state machine runs the same random operations as test_state_machine.py's, with a model of each pool's
contents: every sequence must read its own tokens through its full table, and through its window table at every
position the next query's window covers."""

from __future__ import annotations

import pytest
from hypothesis import event, settings

from kvpool import (
    HybridKVCacheManager,
    KVPoolConfig,
    KVSpec,
    NoFreeBlocksError,
    PagedKVCacheManager,
    StepDemand,
    kv_cache_manager_from_config,
    new_hybrid_manager,
)
from kvpool.sizing import window_blocks_wanted, window_table_blocks
from kvpool.window import NO_BLOCK
from tests.kvpool.helpers import snapshot
from tests.kvpool.test_state_machine import KVPoolMachine

BLOCK, WINDOW = 4, 6


def hybrid(num_blocks: int = 32, window_blocks: int = 16, caching: bool = True) -> HybridKVCacheManager:
    return new_hybrid_manager(num_blocks, window_blocks, BLOCK, WINDOW, step_tokens=6,
                              enable_prefix_caching=caching)


def decode(manager: HybridKVCacheManager, seq_id: int, tokens: list[int], steps: int) -> None:
    for _ in range(steps):
        tokens.append(len(tokens) % 7)
        assert manager.append([seq_id], [tokens], [1])[0] == 1


def test_a_decoding_table_gives_back_what_falls_behind_its_window() -> None:
    manager = hybrid()
    tokens = list(range(5))
    manager.allocate(1, tokens, 5)
    decode(manager, 1, tokens, 40)
    table = manager.window_table(1)
    first_needed = (len(tokens) - WINDOW) // BLOCK  # the last query read from here on (given back lazily)
    assert table[:first_needed] == [NO_BLOCK] * first_needed and NO_BLOCK not in table[first_needed:]
    assert len(table) - first_needed <= window_table_blocks(WINDOW, BLOCK, 1)
    assert len(manager.block_table(1)) == -(-len(tokens) // BLOCK)  # the full layers keep every block
    stats = manager.stats()
    assert stats.window_used_blocks == len(table) - first_needed and stats.used_blocks == len(manager.block_table(1))
    manager.check_invariants()


def test_given_back_entries_are_reported_as_changes() -> None:
    manager = hybrid()
    tokens = list(range(12))
    manager.allocate(1, tokens, 12)
    window_before = manager.window_table(1)
    tokens += [1, 2, 3, 4]
    done, changes = manager.append([1], [tokens], [4])  # the first query, at 12, reads 7..: block 0 is behind it
    assert done == 1
    assert (0, 0, NO_BLOCK, 1) in changes and window_before[0] not in manager.window_table(1)
    assert {c[3] for c in changes} == {0, 1}  # both groups grew a block


def test_a_prefix_is_served_only_where_its_window_is_still_cached() -> None:
    manager = hybrid(num_blocks=32, window_blocks=8)
    prompt = list(range(20))  # 5 blocks; the last token stays out of the prefix lookup: 4 can be served
    manager.allocate(1, prompt, 20)
    manager.free(1)
    assert manager.num_cached_tokens(prompt + [99]) == 20
    hit = manager.allocate(2, prompt + [99], 21)
    assert hit == 20 and manager.window_table(2)[:3] == [NO_BLOCK] * 3  # query 20 reads 15..: block 3 on
    manager.free(2)
    # Another prompt takes every window block: the cached ones are evicted, the full layers' stay cached.
    other = [50 + i for i in range(29)]
    manager.allocate(3, other, 29)
    assert manager.num_cached_tokens(prompt + [99]) == 0
    manager.check_invariants()


def test_a_prefix_is_served_up_to_where_its_window_is_cached() -> None:
    manager = hybrid(num_blocks=32, window_blocks=16)
    prompt = list(range(24))  # 6 blocks, all cached in both pools once freed
    manager.allocate(1, prompt, 24)
    manager.free(1)
    # Evict the window pool's copy of block 4: serving 6 or 5 blocks needs it (the query at 24 reads 19..,
    # at 20 reads 15..), serving 4 needs blocks 2 and 3 only (the query at 16 reads 11..).
    pool = manager.window._pool
    block = pool.lookup(manager.full.cached_prefix(prompt + [0])[1][4])
    assert block is not None
    pool.free_queue.remove(block)
    pool.free_queue.appendleft(block)
    pool.release(pool.allocate(1))
    assert manager.num_cached_tokens(prompt + [0]) == 16
    assert manager.allocate(2, prompt + [0], 25) == 16
    assert manager.window_table(2)[:2] == [NO_BLOCK] * 2 and len(manager.block_table(2)) == 7
    manager.check_invariants()


def test_admission_needs_both_pools() -> None:
    manager = hybrid(num_blocks=64, window_blocks=5)
    manager.allocate(1, list(range(17)), 17)  # 5 window blocks
    assert manager.stats().free_blocks > 50
    assert not manager.can_allocate([9] * 4, 4)
    with pytest.raises(NoFreeBlocksError):
        manager.allocate(2, [9] * 4, 4)
    assert not manager.has_sequence(2)
    manager.check_invariants()


def test_an_append_the_full_layers_cannot_serve_leaves_both_tables_where_they_were() -> None:
    manager = hybrid(num_blocks=6, window_blocks=16)
    a, b = list(range(12)), list(range(100, 112))
    manager.allocate(1, a, 12)
    manager.allocate(2, b, 12)  # the full pool is now empty
    a.append(1)
    b.append(2)
    window_b = manager.window_table(2)
    done, changes = manager.append([1, 2], [a, b], [1, 1])
    assert done == 0 and manager.window_table(2)[len(window_b):] == []
    assert all(c[1] < len(manager.window_table(1)) for c in changes if c[3] == 1)
    assert manager.window_table(2)[0] == NO_BLOCK  # behind the window whatever comes next
    manager.check_invariants()
    manager.free(2)
    assert manager.append([1], [a], [1])[0] == 1
    manager.check_invariants()


def test_a_fork_shares_both_tables_and_copies_on_write_in_each_pool() -> None:
    manager = hybrid()
    tokens = list(range(10))
    manager.allocate(1, tokens, 10)
    manager.fork(1, 2)
    child = tokens + [5]
    done, _ = manager.append([2], [child], [1])
    assert done == 1
    assert manager.take_block_copies() == [(manager.block_table(1)[2], manager.block_table(2)[2])]
    assert manager.take_window_block_copies() == [(manager.window_table(1)[2], manager.window_table(2)[2])]
    manager.check_invariants()


def test_the_config_gives_a_model_with_both_kinds_of_layer_two_pools() -> None:
    spec = KVSpec(num_layers=18, num_kv_heads=1, head_dim=256, dtype_bytes=2, block_size=16, window_layers=15,
                  sliding_window=512)
    manager = kv_cache_manager_from_config(KVPoolConfig(kv_cache_memory="1GiB"), spec, 32768,
                                           demand=StepDemand(running_seqs=64, step_tokens=512))
    assert isinstance(manager, HybridKVCacheManager)
    wanted = window_blocks_wanted(512, 16, 64, 512)
    assert manager.window_blocks == wanted == 64 * 34 + 32
    per_layer_block = 2 * 256 * 2 * 16
    assert manager.num_blocks == (2**30 - wanted * 15 * per_layer_block) // (3 * per_layer_block)
    one_pool = spec.num_blocks_for(2**30)
    assert manager.num_blocks > 2.9 * one_pool  # what the windows save goes to the full layers' tokens


def test_the_config_keeps_one_pool_where_no_or_every_layer_slides_and_for_the_contiguous_layout() -> None:
    for layers in (0, 18):
        spec = KVSpec(18, 1, 256, 2, 16, window_layers=layers, sliding_window=512)
        assert isinstance(kv_cache_manager_from_config(KVPoolConfig(num_blocks=100), spec, 1024), PagedKVCacheManager)
    spec = KVSpec(18, 1, 256, 2, 16, window_layers=15, sliding_window=512)
    contiguous = KVPoolConfig(num_blocks=100, kv_layout="contiguous")
    assert not isinstance(kv_cache_manager_from_config(contiguous, spec, 1024), HybridKVCacheManager)


def test_a_window_pool_too_small_for_one_sequence_is_refused() -> None:
    spec = KVSpec(18, 1, 256, 2, 16, window_layers=15, sliding_window=512)
    config = KVPoolConfig(num_blocks=100, num_window_blocks=40)
    with pytest.raises(ValueError, match="at least 65 blocks"):
        kv_cache_manager_from_config(config, spec, 1024, demand=StepDemand(step_tokens=512))
    small = kv_cache_manager_from_config(KVPoolConfig(num_blocks=30), spec, 1024, demand=StepDemand(1, 512))
    assert small.window_blocks == window_table_blocks(512, 16, 512)  # a small pool asked for still runs one alone


class HybridMachine(KVPoolMachine):
    """KVPoolMachine over a HybridKVCacheManager; `manager` is its full layers' side as the base machine reads
    it, and the window side is followed through its own mirror and contents."""

    window_blocks = 12

    def __init__(self) -> None:
        self.hybrid = new_hybrid_manager(self.num_blocks, self.window_blocks, self.block_size, WINDOW,
                                         step_tokens=40, enable_prefix_caching=self.caching)
        self.window_kv: dict[int, int] = {}
        self.window_mirror: dict[int, list[int]] = {}
        super().__init__()

    def new_manager(self) -> PagedKVCacheManager:
        return _FullView(self)  # type: ignore[return-value]

    def _write_window(self, seq_ids: list[int], starts: list[int], ends: list[int]) -> None:
        for src, dst in self.hybrid.take_window_block_copies():
            for offset in range(self.block_size):
                value = self.window_kv.get(src * self.block_size + offset)
                if value is not None:
                    self.window_kv[dst * self.block_size + offset] = value
        for seq_id, start, end in zip(seq_ids, starts, ends, strict=True):
            table = self.window_mirror[seq_id]
            for p in range(start, end):
                assert table[p // self.block_size] != NO_BLOCK, "a new token's block was given back"
                self.window_kv[table[p // self.block_size] * self.block_size + p % self.block_size] = \
                    self.tokens[seq_id][p]

    def _check_stop(self, seq_ids: list[int], counts: list[int], done: int, before: object) -> None:
        """As the base machine's, where either pool may be the one out of blocks."""
        if done < len(seq_ids):
            assert done > 0 or snapshot(self.manager, list(self.tokens)) == before

    def teardown(self) -> None:
        super().teardown()
        assert self.hybrid.stats().window_used_blocks == 0 and not self.window_mirror

    def window_reads_its_own_tokens(self) -> None:
        for seq_id in self.window_mirror:
            tokens = self.tokens[seq_id]
            table, n = self.hybrid.window_table(seq_id), self.hybrid.full.num_tokens(seq_id)
            for p in range(max(0, n - WINDOW + 1), n):
                block = table[p // self.block_size]
                assert block != NO_BLOCK and self.window_kv.get(block * self.block_size + p % self.block_size) \
                    == tokens[p], f"seq {seq_id} position {p}"


class _FullView:
    """The hybrid manager as the base machine drives it: its calls go to the hybrid, its reads to the full side,
    and the window side's changes and contents are checked on the way."""

    def __init__(self, machine: HybridMachine) -> None:
        self.m = machine
        self._pool, self.block_size = machine.hybrid.full._pool, machine.block_size

    def __getattr__(self, name: str) -> object:
        return getattr(self.m.hybrid.full, name)

    def num_cached_tokens(self, tokens: list[int]) -> int:
        return self.m.hybrid.num_cached_tokens(tokens)

    def can_allocate(self, tokens: list[int], count: int) -> bool:
        return self.m.hybrid.can_allocate(tokens, count)

    def allocate(self, seq_id: int, tokens: list[int], count: int) -> int:
        served = self.m.hybrid.allocate(seq_id, tokens, count)
        self.m.window_mirror[seq_id] = self.m.hybrid.window_table(seq_id)
        self.m.tokens[seq_id] = tokens  # the base machine sets it after this; the window writes need it now
        self.m._write_window([seq_id], [served], [self.m.hybrid.full.num_tokens(seq_id)])
        return served

    def append(self, seq_ids: list[int], tokens: list[list[int]], counts: list[int]
               ) -> tuple[int, list[tuple[int, int, int, int]]]:
        starts = [self.m.hybrid.full.num_tokens(s) for s in seq_ids]
        done, changes = self.m.hybrid.append(seq_ids, tokens, counts)
        if done < len(seq_ids):
            event("hybrid append stopped")
            held = self.m.hybrid.window.num_tokens(seq_ids[done])
            assert held == starts[done]
        for index, position, block, group in changes:
            if group == 1:
                table = self.m.window_mirror[seq_ids[index]]
                table.extend([0] * (position + 1 - len(table)))
                table[position] = block
                event("window block given back" if block == NO_BLOCK else "window block set")
        ends = [s + c for s, c in zip(starts, counts, strict=False)]
        self.m._write_window(seq_ids[:done], starts[:done], ends[:done])
        return done, [c for c in changes if c[3] == 0]

    def fork(self, parent: int, child: int) -> None:
        self.m.hybrid.fork(parent, child)
        self.m.window_mirror[child] = self.m.hybrid.window_table(child)

    def free(self, seq_id: int) -> None:
        self.m.hybrid.free(seq_id)
        self.m.window_mirror.pop(seq_id, None)

    def reset_prefix_cache(self) -> None:
        self.m.hybrid.reset_prefix_cache()

    def take_block_copies(self) -> list[tuple[int, int]]:
        return self.m.hybrid.take_block_copies()

    def check_invariants(self) -> None:
        self.m.hybrid.check_invariants()
        assert self.m.hybrid.take_window_block_copies() == []
        assert self.m.window_mirror == {s: self.m.hybrid.window_table(s) for s in self.m.window_mirror}
        self.m.window_reads_its_own_tokens()


class NoCachingHybridMachine(HybridMachine):
    caching = False


TestHybridPool = HybridMachine.TestCase
TestHybridPool.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestHybridNoCaching = NoCachingHybridMachine.TestCase
TestHybridNoCaching.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)
