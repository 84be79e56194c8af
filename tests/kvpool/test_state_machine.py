"""Random operation sequences against a model of the KV contents.

The model writes each token into the slot the manager hands out and applies the reported block copies,
so any sharing bug (a write into someone else's block, a stale prefix hit, a missed copy) shows up as a
sequence whose slots no longer hold its own tokens.
"""

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpool import KVCacheManager, NoFreeBlocksError
from tests.kvpool.helpers import snapshot

FAMILIES = [[1, 2, 1, 3, 1, 2, 1, 4, 5, 6, 7, 8], [1, 2, 1, 3, 9, 9, 9, 9, 2, 2], [7] * 12]
TAIL = st.integers(0, 3**14 - 1)  # up to 14 tokens in base 3: cheaper to draw than a list strategy


def base3_tokens(seed: int, length: int) -> list[int]:
    """A tiny vocabulary {0, 1, 2}, so equal blocks and prefix hits are frequent."""
    return [seed // 3**i % 3 for i in range(length)]


class KVPoolMachine(RuleBasedStateMachine):
    num_blocks = 16
    block_size = 4
    kv_layout = "paged"
    caching = True
    max_model_len = 64

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(
            self.num_blocks,
            self.block_size,
            enable_prefix_caching=self.caching,
            kv_layout=self.kv_layout,
            max_model_len=self.max_model_len,
        )
        self.tokens: dict[int, list[int]] = {}  # every token each live sequence knows so far
        self.waiting: list[list[int]] = []  # preempted sequences, to be re-admitted
        self.kv: dict[int, int] = {}  # slot -> token whose KV it holds
        self.mirror: dict[int, list[int]] = {}  # each table as a caller of append_many keeps it, from its changes
        self.next_id = 0

    # --- helpers ---------------------------------------------------------------------------------

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

    def _admit(self, tokens: list[int], num_tokens: int) -> bool:
        seq_id, self.next_id = self.next_id, self.next_id + 1
        cached = self.manager.num_cached_tokens(tokens)
        fits = self.manager.can_allocate(tokens, num_tokens)
        before = snapshot(self.manager, list(self.tokens))
        try:
            allocation = self.manager.allocate(seq_id, tokens, num_tokens)
        except NoFreeBlocksError:
            assert not fits and snapshot(self.manager, list(self.tokens)) == before
            event("admission refused")
            return False
        assert fits and allocation.num_cached_tokens == cached
        event("prefix hit" if cached else "prefix miss")
        assert cached % self.block_size == 0 and cached < len(tokens)
        covered = self.manager.num_tokens(seq_id)
        assert covered == max(num_tokens, cached)
        self._write(allocation.slots, tokens[cached:covered])
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
    @rule(pick=st.integers(0, 99), count=st.integers(1, 6), new=TAIL)
    def append(self, pick: int, count: int, new: int) -> None:
        seq_id = self._pick(pick)
        tokens, start = self.tokens[seq_id], self.manager.num_tokens(seq_id)
        tokens.extend(base3_tokens(new, max(0, start + count - len(tokens))))
        fits = self.manager.can_append(seq_id, count)
        before = snapshot(self.manager, list(self.tokens))
        slots = self.manager.append_slots(seq_id, tokens, count)
        if slots is None:
            assert not fits and snapshot(self.manager, list(self.tokens)) == before
            event("append out of blocks")
            return
        assert fits and self.manager.num_tokens(seq_id) == start + count
        self._write(slots, tokens[start : start + count])
        self.mirror[seq_id] = self.manager.block_table(seq_id)

    @precondition(lambda self: self.tokens)
    @rule(picks=st.lists(st.integers(0, 99), min_size=1, max_size=4), counts=st.lists(st.integers(1, 5), min_size=4,
          max_size=4), new=TAIL)
    def append_many(self, picks: list[int], counts: list[int], new: int) -> None:
        """One step's appends for several sequences; the tables are followed through the reported changes."""
        seq_ids = list(dict.fromkeys(self._pick(p) for p in picks))
        counts = counts[: len(seq_ids)]
        starts = [self.manager.num_tokens(s) for s in seq_ids]
        for seq_id, start, count in zip(seq_ids, starts, counts, strict=True):
            self.tokens[seq_id].extend(base3_tokens(new, max(0, start + count - len(self.tokens[seq_id]))))
        changes: list[tuple[int, int, int]] = []
        done = self.manager.append_many(seq_ids, [self.tokens[s] for s in seq_ids], counts, changes)
        event("append_many out of blocks" if done < len(seq_ids) else "append_many")
        for index, position, block in changes:
            assert index < done
            table = self.mirror[seq_ids[index]]
            table.extend([-1] * (position + 1 - len(table)))
            table[position] = block
        slots: list[int] = []
        written: list[int] = []
        for i, (seq_id, start, count) in enumerate(zip(seq_ids, starts, counts, strict=True)):
            assert self.manager.num_tokens(seq_id) == (start + count if i < done else start)
            if i < done:
                table = self.mirror[seq_id]
                slots += [table[p // self.block_size] * self.block_size + p % self.block_size
                          for p in range(start, start + count)]
                written += self.tokens[seq_id][start : start + count]
        self._write(slots, written)

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
            held = [self.kv.get(table[p // size] * size + p % size) for p in range(self.manager.num_tokens(seq_id))]
            assert held == tokens[: len(held)], f"seq {seq_id}"

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
    kv_layout = "contiguous"
    max_model_len = 32


TestPagedPool = KVPoolMachine.TestCase
TestPagedPool.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestNoCaching = NoCachingMachine.TestCase
TestNoCaching.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)
TestContiguous = ContiguousMachine.TestCase
TestContiguous.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)
