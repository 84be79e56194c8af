"""The engine core on a tiny KV pool under random load: requests of random lengths, max_tokens (or none), n,
ignore_eos and priority arrive, are aborted, and steps run on a backend whose tokens depend on position only.

After every step: the pool's accounting is exact (its invariants, and blocks held by running sequences
alone), the scheduler's rows mirror the running sequences, and no sequence was preempted past the bound.
Every step with work makes progress, and once arrivals stop everything ends within a bound on steps: the
head of the queue always runs, and the queue behind it moves up when it finishes or fails.
"""

from __future__ import annotations

import math

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler.core import EngineCore
from scheduler.errors import KV_CACHE_EXHAUSTED, PromptTooLongError
from scheduler.output_processor import RequestState
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.sequence import Sequence, SequenceStatus
from tests.scheduler.fake_model import EOS, PositionBackend, make_core

BLOCK, CONTEXT, BUDGET, MAX_SEQS = 4, 64, 16, 4
LAYOUTS = {  # name: (kv_layout, prefix caching, the pool's context for the contiguous reservation)
    "paged": ("paged", True, CONTEXT),
    "uncached": ("paged", False, CONTEXT),
    "contiguous": ("contiguous", False, 4 * BLOCK),  # a 4-block reservation that long sequences grow past
}


class KVPressureMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core: EngineCore = make_core(4)  # replaced by pool()
        self.backend = PositionBackend()
        self.states: dict[str, RequestState] = {}  # every admitted request, kept after it ends
        self.aborted: set[str] = set()
        self.next_id = 0

    @initialize(num_blocks=st.integers(4, 12), layout=st.sampled_from(sorted(LAYOUTS)),
                scheduling=st.sampled_from(["fcfs", "priority"]), bound=st.sampled_from([0, 1, 2, 3, 8]),
                eos_every=st.sampled_from([0, 0, 6, 11]))
    def pool(self, num_blocks: int, layout: str, scheduling: str, bound: int, eos_every: int) -> None:
        kv_layout, caching, kv_context = LAYOUTS[layout]
        self.core = make_core(num_blocks, BLOCK, CONTEXT, kv_layout, kv_context, caching,
                              max_num_batched_tokens=BUDGET, max_num_seqs=MAX_SEQS, scheduling=scheduling,
                              max_preemptions=bound)
        self.backend = PositionBackend(eos_every)

    # --- rules -----------------------------------------------------------------------------------------------
    @rule(prompt_len=st.integers(1, 12) | st.integers(1, 50), n=st.integers(1, 3),
          max_tokens=st.none() | st.integers(1, 12) | st.integers(1, 48),
          ignore_eos=st.booleans(), priority=st.integers(0, 2), prefix=st.integers(0, 2))
    def arrive(self, prompt_len: int, max_tokens: int | None, n: int, ignore_eos: bool, priority: int,
               prefix: int) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        prompt = tuple(100 + (i + prefix) % 9 for i in range(prompt_len))  # shared prefixes hit the cache
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n, ignore_eos=ignore_eos)
        capacity = self.core.kv.max_sequence_tokens
        too_big = prompt_len >= capacity or (max_tokens is not None and prompt_len + max_tokens > capacity)
        try:
            self.core.add_request(EngineRequest(rid, prompt, params, priority))
        except PromptTooLongError:
            assert too_big
            event("refused: more than the pool holds")
            return
        assert not too_big
        self.states[rid] = self.core.requests[rid]

    @rule()
    def step(self) -> None:
        if self.core.has_work:
            self._step()
        else:
            assert self.core.plan().batch is None

    @precondition(lambda self: self.core.requests)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self._abort(data.draw(st.sampled_from(sorted(self.core.requests))))

    @precondition(lambda self: self.core.has_work and self.core.requests)
    @rule(data=st.data())
    def abort_while_the_step_runs(self, data: st.DataObject) -> None:
        self._step(abort=data.draw(st.sampled_from(sorted(self.core.requests))))

    def _step(self, abort: str | None = None) -> None:
        plan = self.core.plan()
        assert plan.batch is not None, "work waits that could run: the first running or waiting sequence can"
        self._check_accounting()
        if plan.failed:
            event("a request failed: preempted past the bound")
        if plan.preempted:
            event("preempted")
        if abort is not None:
            self._abort(abort)
        self.core.commit(plan, self.backend.execute(plan.batch), self.core.clock())

    def _abort(self, rid: str) -> None:
        self.core.abort(rid)
        self.aborted.add(rid)

    # --- after every rule --------------------------------------------------------------------------------
    @invariant()
    def accounting_is_exact(self) -> None:
        self._check_accounting()

    @invariant()
    def no_sequence_is_preempted_past_the_bound(self) -> None:
        for seq in self._seqs():
            assert seq.num_preemptions <= self.core.config.max_preemptions
            assert seq.num_tokens <= self.core.scheduler.max_seq_len

    @invariant()
    def a_request_is_in_flight_until_its_stream_ends(self) -> None:
        for rid, state in self.states.items():
            assert (rid in self.core.requests) != state.stream.finished

    def _check_accounting(self) -> None:
        """Pool invariants (ref counts equal table references), and only running sequences hold tables: so
        every block in use is held by a running sequence, and nothing leaks."""
        self.core.kv.check_invariants()
        self.core.scheduler.check_rows()
        for seq in self._seqs():
            assert self.core.kv.has_sequence(seq.seq_id) == (seq.status is SequenceStatus.RUNNING)
        if not self.core.scheduler.running:
            assert self.core.kv.stats().used_blocks == 0

    def _seqs(self) -> list[Sequence]:
        return [seq for state in self.states.values() for seq in state.seqs]

    # --- liveness ------------------------------------------------------------------------------------------
    def teardown(self) -> None:
        limit = self._step_bound()
        steps = 0
        while self.core.has_work:
            assert steps < limit, f"still working after {steps} steps"
            self._step()
            self._check_accounting()
            steps += 1
        assert not self.core.requests and not self.core.scheduler.running and not self.core.scheduler.waiting
        stats = self.core.kv.stats()
        assert stats.used_blocks == 0 and stats.free_blocks == stats.num_blocks  # cached blocks are free
        for rid, state in self.states.items():
            self._check_outcome(rid, state)

    def _step_bound(self) -> int:
        """Each step computes a token of the first running sequence (or admits the first waiting one). Under
        FCFS nothing gets ahead of it, so each sequence leads once, for at most its length in steps. Under
        priority, one leading may be overtaken by a waiting request that outranks it and lose its progress,
        but only to a preemption, of which each sequence has at most the bound."""
        live = [s for s in self._seqs() if not s.status.finished]
        total = sum(self._max_len(s) for s in live)
        rounds = 1 if self.core.config.scheduling == "fcfs" else self.core.config.max_preemptions + 1
        return total * rounds + 1

    def _max_len(self, seq: Sequence) -> int:
        asked = math.inf if seq.params.max_tokens is None else seq.prompt_len + seq.params.max_tokens
        return int(min(asked, self.core.scheduler.max_seq_len))

    def _check_outcome(self, rid: str, state: RequestState) -> None:
        out = state.stream.take_finished()
        if out.error is not None:
            assert out.error_code == KV_CACHE_EXHAUSTED
            assert any(s.num_preemptions == self.core.config.max_preemptions for s in state.seqs)
            return
        if rid in self.aborted:
            return
        for seq, choice in zip(state.seqs, out.choices, strict=True):
            assert choice.finish_reason == seq.status.finish_reason
            if seq.status is SequenceStatus.FINISHED_LENGTH:
                assert seq.num_tokens == self._max_len(seq)
                if seq.params.max_tokens is None and seq.num_tokens < CONTEXT:
                    event("no max_tokens: ended by length at the pool's size")
            else:
                assert seq.status is SequenceStatus.FINISHED_STOPPED
                assert seq.token_ids[-1] == EOS and not seq.params.ignore_eos


TestKVPressureMachine = KVPressureMachine.TestCase
TestKVPressureMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
