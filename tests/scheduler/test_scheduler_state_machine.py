"""Random arrivals, aborts, lengths and a small block pool against the scheduler's invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backends.base import StepOutput
from kvpool import KVCacheManager, new_hybrid_manager
from kvpool.sizing import window_table_blocks
from scheduler.sequence import Sequence, SequenceStatus
from tests.scheduler.helpers import check_batch, make_scheduler, make_seqs, step

BUDGET, MAX_SEQS = 16, 4


class SchedulerMachine(RuleBasedStateMachine):
    scheduling = "fcfs"

    def __init__(self) -> None:
        super().__init__()
        self.sched = make_scheduler(num_blocks=12, block_size=4, max_model_len=40, max_num_batched_tokens=BUDGET,
                                    max_num_seqs=MAX_SEQS, scheduling=self.scheduling, kv=self.new_kv())
        self.requests: dict[str, list[Sequence]] = {}
        self.next_id = 0

    def new_kv(self) -> KVCacheManager | None:
        return None  # make_scheduler's paged pool

    @rule(prompt_len=st.integers(1, 30), max_tokens=st.integers(1, 12), n=st.integers(1, 2))
    def arrive(self, prompt_len: int, max_tokens: int, n: int) -> None:
        seqs = make_seqs(self.next_id, prompt_len, max_tokens=max_tokens, n=n, first_token=3,
                         priority=self.next_id % 3)
        self.next_id += n
        self.requests[seqs[0].request_id] = seqs
        self.sched.add(seqs)

    @precondition(lambda self: self.sched.has_work)
    @rule(eos_every=st.integers(0, 7))
    def run_step(self, eos_every: int) -> None:
        plan = step(self.sched, token_of=lambda s: 2 if eos_every and s.num_tokens % (eos_every + 3) == 0 else 50)
        assert int(plan.counts.sum()) <= BUDGET
        assert len(plan.seqs) <= MAX_SEQS
        assert len({s.seq_id for s in plan.seqs}) == len(plan.seqs)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        for seq in self.requests[request_id]:
            self.sched.finish(seq, SequenceStatus.FINISHED_ABORTED)

    @precondition(lambda self: self.sched.has_work and self.requests)
    @rule(data=st.data())
    def abort_while_the_step_runs(self, data: st.DataObject) -> None:
        """The engine's case: a client goes away between plan and update; its rows go at once."""
        plan = self.sched.schedule()
        check_batch(self.sched, plan)
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        for seq in self.requests[request_id]:
            self.sched.finish(seq, SequenceStatus.FINISHED_ABORTED)
        self.sched.check_rows()
        updates = self.sched.update(plan, StepOutput(np.full(len(plan.sampled), 50, np.int64)))
        event("aborted a sampled sequence" if len(updates.seqs) < len(plan.sampled) else "aborted another")
        assert all(s.request_id != request_id for s in updates.seqs)
        assert all(s.status is SequenceStatus.RUNNING or i in updates.finished for i, s in enumerate(updates.seqs))
        self.sched.kv.check_invariants()

    @invariant()
    def rows_mirror_the_running_sequences(self) -> None:
        self.sched.check_rows()

    @invariant()
    def every_live_sequence_is_queued_exactly_once(self) -> None:
        queued = [s.seq_id for s in (*self.sched.waiting, *self.sched.running)]
        assert len(queued) == len(set(queued))
        for seqs in self.requests.values():
            head, *children = seqs
            for seq in seqs:
                pending = seq.status is SequenceStatus.FORK_PENDING
                assert (seq.seq_id in queued) == (not seq.status.finished and not pending)
                assert not pending or (seq in head.children and head.status < SequenceStatus.FINISHED_STOPPED)
        self.sched.kv.check_invariants()

    def teardown(self) -> None:
        for _ in range(2000):
            if not self.sched.has_work:
                break
            step(self.sched)
        assert not self.sched.has_work
        assert all(s.status.finished for seqs in self.requests.values() for s in seqs)
        stats = self.sched.kv.stats()
        assert stats.used_blocks == 0 and stats.free_blocks == stats.num_blocks and stats.window_used_blocks == 0
        self.sched.kv.check_invariants()


class PriorityMachine(SchedulerMachine):
    scheduling = "priority"  # admissions land mid-list and preemption picks by priority: rows out of order


class WindowPoolMachine(SchedulerMachine):
    """A model with sliding layers (a 6-position window) keeping their KV in a pool of their own, just big enough
    for one sequence's window and a step's chunk: tables give blocks back as they run, forks copy on write in
    both pools, and preemption comes from either pool running dry."""

    def new_kv(self) -> KVCacheManager | None:
        return new_hybrid_manager(12, window_table_blocks(6, 4, BUDGET) + 2, 4, 6, step_tokens=BUDGET)


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestPriorityMachine = PriorityMachine.TestCase
TestWindowPoolMachine = WindowPoolMachine.TestCase
TestWindowPoolMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestPriorityMachine.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
