"""Random operation sequences against a model of the KV contents.

The model writes each token into its slot, read off the block table as a caller of append() keeps it (patched
with the entries append() reports), and applies the reported block copies, so any sharing bug (a write into
someone else's block, a stale prefix hit, a missed copy) shows up as a sequence whose slots no longer hold its
own tokens.
"""

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpool import ContiguousKVCacheManager, NoFreeBlocksError, PagedKVCacheManager
from kvpool.block_tables import BlockTables
from tests.kvpool.helpers import blocks_needed, num_tokens, slots, snapshot

FAMILIES = [[1, 2, 1, 3, 1, 2, 1, 4, 5, 6, 7, 8], [1, 2, 1, 3, 9, 9, 9, 9, 2, 2], [7] * 12]
TAIL = st.integers(0, 3**14 - 1)  # up to 14 tokens in base 3: cheaper to draw than a list strategy


def base3_tokens(seed: int, length: int) -> list[int]:
    """A tiny vocabulary {0, 1, 2}, so equal blocks and prefix hits are frequent."""
    return [seed // 3**i % 3 for i in range(length)]


class KVPoolMachine(RuleBasedStateMachine):
    num_blocks = 16
    block_size = 4
    caching = True

    def __init__(self) -> None:
        super().__init__()
        self.manager = self.new_manager()
        self.tokens: dict[int, list[int]] = {}  # every token each live sequence knows so far
        self.waiting: list[list[int]] = []  # preempted sequences, to be re-admitted
        self.kv: dict[int, int] = {}  # slot -> token whose KV it holds
        self.mirror: dict[int, list[int]] = {}  # each table as a caller of append keeps it, from its changes
        self.next_id = 0

    # --- helpers ---------------------------------------------------------------------------------

    def new_manager(self) -> BlockTables:
        return PagedKVCacheManager(self.num_blocks, self.block_size, enable_prefix_caching=self.caching)

    def _pick(self, pick: int) -> int:
        return sorted(self.tokens)[pick % len(self.tokens)]

    def _write(self, slots: list[int], tokens: list[int]) -> None:
        for src, dst in self.manager.take_block_copies():  # copies run before the step's writes
            event("copy-on-write")
            for offset in range(self.block_size):
                value = self.kv.get(src * self.block_size + offset)
                if value is not None:
                    self.kv[dst * self.block_size + offset] = value
        assert len(slots) == len(tokens)
        self.kv.update(zip(slots, tokens, strict=True))

    def _admit(self, tokens: list[int], count: int) -> bool:
        seq_id, self.next_id = self.next_id, self.next_id + 1
        cached = self.manager.num_cached_tokens(tokens)
        fits = self.manager.can_allocate(tokens, count)
        before = snapshot(self.manager, list(self.tokens))
        try:
            served = self.manager.allocate(seq_id, tokens, count)
        except NoFreeBlocksError:
            assert not fits and snapshot(self.manager, list(self.tokens)) == before
            event("admission refused")
            return False
        assert fits and served == cached
        event("prefix hit" if cached else "prefix miss")
        assert cached % self.block_size == 0 and cached < len(tokens)
        covered = num_tokens(self.manager, seq_id)
        assert covered == max(count, cached)
        self._write(slots(self.manager, seq_id, cached, covered), tokens[cached:covered])
        self.tokens[seq_id] = tokens
        self.mirror[seq_id] = self.manager.block_table(seq_id)
        return True

    # --- rules -----------------------------------------------------------------------------------

    @rule(family=st.integers(0, 2), cut=st.integers(0, 12), tail=TAIL, tail_len=st.integers(0, 14),
          chunk=st.integers(1, 32))
    def allocate(self, family: int, cut: int, tail: int, tail_len: int, chunk: int) -> None:
        tokens = FAMILIES[family][:cut] + base3_tokens(tail, tail_len) or [0]
        self._admit(tokens, min(chunk, len(tokens)))

    @precondition(lambda self: self.waiting)
    @rule(chunk=st.integers(1, 40))
    def resume_preempted(self, chunk: int) -> None:
        tokens = self.waiting[0]
        if self._admit(tokens, min(chunk, len(tokens))):
            self.waiting.pop(0)

    @precondition(lambda self: self.tokens)
    @rule(picks=st.lists(st.integers(0, 99), min_size=1, max_size=4), counts=st.lists(st.integers(1, 6), min_size=4,
          max_size=4), new=TAIL)
    def append(self, picks: list[int], counts: list[int], new: int) -> None:
        """One step's appends for one or more sequences; the tables are followed through the reported changes."""
        seq_ids = list(dict.fromkeys(self._pick(p) for p in picks))
        counts = counts[: len(seq_ids)]
        starts = [num_tokens(self.manager, s) for s in seq_ids]
        for seq_id, start, count in zip(seq_ids, starts, counts, strict=True):
            self.tokens[seq_id].extend(base3_tokens(new, max(0, start + count - len(self.tokens[seq_id]))))
        before = snapshot(self.manager, list(self.tokens))
        done, changes = self.manager.append(seq_ids, [self.tokens[s] for s in seq_ids], counts)
        self._check_stop(seq_ids, counts, done, before)
        for index, position, block, _group in changes:
            assert index < done
            table = self.mirror[seq_ids[index]]
            table.extend([-1] * (position + 1 - len(table)))
            table[position] = block
        written_slots: list[int] = []
        written: list[int] = []
        for i, (seq_id, start, count) in enumerate(zip(seq_ids, starts, counts, strict=True)):
            assert num_tokens(self.manager, seq_id) == (start + count if i < done else start)
            if i < done:
                table = self.mirror[seq_id]
                written_slots += [table[p // self.block_size] * self.block_size + p % self.block_size
                                  for p in range(start, start + count)]
                written += self.tokens[seq_id][start : start + count]
        self._write(written_slots, written)

    def _check_stop(self, seq_ids: list[int], counts: list[int], done: int, before: object) -> None:
        """An append stops only at a sequence the free blocks cannot serve (as it found them: it changed
        nothing for that one), and changes nothing when it stops at the first."""
        if done == len(seq_ids):
            event("append")
            return
        event("append out of blocks")
        assert blocks_needed(self.manager, seq_ids[done], counts[done]) > self.manager.stats().free_blocks
        assert done > 0 or snapshot(self.manager, list(self.tokens)) == before

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 99))
    def fork(self, pick: int) -> None:
        parent = self._pick(pick)
        child, self.next_id = self.next_id, self.next_id + 1
        self.manager.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.mirror[child] = self.manager.block_table(child)

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 99))
    def free(self, pick: int) -> None:
        seq_id = self._pick(pick)
        self.manager.free(seq_id)
        del self.tokens[seq_id]
        del self.mirror[seq_id]

    @precondition(lambda self: self.tokens)
    @rule(pick=st.integers(0, 99))
    def preempt(self, pick: int) -> None:
        seq_id = self._pick(pick)
        self.manager.free(seq_id)
        self.waiting.append(self.tokens.pop(seq_id))
        del self.mirror[seq_id]

    @rule()
    def reset_prefix_cache(self) -> None:
        self.manager.reset_prefix_cache()

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def pool_is_consistent(self) -> None:
        self.manager.check_invariants()
        assert self.manager.take_block_copies() == []

    @invariant()
    def mirrors_follow_the_tables(self) -> None:
        assert self.mirror == {s: self.manager.block_table(s) for s in self.tokens}

    @invariant()
    def every_sequence_reads_its_own_tokens(self) -> None:
        size = self.block_size
        for seq_id, tokens in self.tokens.items():
            table = self.manager.block_table(seq_id)
            covered = range(num_tokens(self.manager, seq_id))
            held = [self.kv.get(table[p // size] * size + p % size) for p in covered]
            assert held == tokens[: len(held)], f"seq {seq_id}"

    @invariant()
    def block_map_counts_the_tables(self) -> None:
        """The dashboard's map: a block in one table 'u', in several 's'; a free one 'c' when it holds a cached
        prefix (as many as the pool's count of them), else '.'."""
        tables = Counter(block for table in self.mirror.values() for block in table)
        states = self.manager.block_map()
        assert len(states) == self.num_blocks
        for block, state in enumerate(states):
            held = tables[block]
            assert state == ("s" if held > 1 else "u" if held else state if state in ".c" else "?"), block
        assert states.count("c") == self.manager.stats().cached_free_blocks
        assert self.caching or "c" not in states

    def teardown(self) -> None:
        for seq_id in list(self.tokens):
            self.manager.free(seq_id)
        self.manager.check_invariants()
        stats = self.manager.stats()
        event("evicted" if stats.evictions else "no eviction")
        assert stats.used_blocks == 0 and stats.free_blocks == self.num_blocks


class NoCachingMachine(KVPoolMachine):
    caching = False


class ContiguousMachine(KVPoolMachine):
    num_blocks = 40

    def new_manager(self) -> BlockTables:
        return ContiguousKVCacheManager(self.num_blocks, self.block_size, max_model_len=32)


TestPagedPool = KVPoolMachine.TestCase
TestPagedPool.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestNoCaching = NoCachingMachine.TestCase
TestNoCaching.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)
TestContiguous = ContiguousMachine.TestCase
TestContiguous.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)
