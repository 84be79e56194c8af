"""Drive the Scheduler without a model: each sampled row gets a token chosen by a rule."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from backends.base import StepBatch, StepOutput
from kvpool import KVCacheManager, PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.params import SamplingParams
from scheduler.scheduler import Scheduler
from scheduler.sequence import Sequence
from scheduler.step import SchedulerPlan

EOS = 2


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256,
                   kv: KVCacheManager | None = None, **config: object) -> Scheduler:
    kv = kv or PagedKVCacheManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(**config), kv, max_model_len, frozenset({EOS}))  # type: ignore[arg-type]


def make_seqs(seq_id: int, prompt_len: int, max_tokens: int = 4, n: int = 1, priority: int = 0,
              arrival: float | None = None, first_token: int = 10) -> list[Sequence]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n)
    prompt = [first_token + (seq_id * 7 + i) % 50 for i in range(prompt_len)]
    return [Sequence(seq_id=seq_id + i, request_id=f"r{seq_id}", index=i, prompt_len=prompt_len,
                     token_ids=list(prompt), params=params, priority=priority,
                     arrival_time=float(seq_id if arrival is None else arrival)) for i in range(n)]


def step(scheduler: Scheduler, token_of: Callable[[Sequence], int] = lambda s: 100 + s.seq_id
         ) -> SchedulerPlan:
    """Plan one step, 'execute' it, apply it; checks the pool's invariants and the scheduler's rows on the way."""
    plan = scheduler.schedule()
    scheduler.kv.check_invariants()
    scheduler.check_rows()
    check_batch(scheduler, plan)
    tokens = np.array([token_of(s) for s in plan.sampled], np.int64)
    scheduler.update(plan, StepOutput(tokens))
    scheduler.kv.check_invariants()
    scheduler.check_rows()
    return plan


def check_batch(scheduler: Scheduler, plan: SchedulerPlan) -> None:
    """The StepBatch, built from the persistent rows, says what the sequences and the KV manager say."""
    batch, size = plan.batch, scheduler.kv.block_size
    if batch is None:
        return
    assert batch.seq_ids == tuple(s.seq_id for s in plan.seqs)
    for i, (seq, start, count) in enumerate(zip(plan.seqs, plan.starts.tolist(), plan.counts.tolist(), strict=True)):
        table = scheduler.kv.block_table(seq.seq_id)
        assert batch.block_tables[i, : len(table)].tolist() == table and not batch.block_tables[i, len(table) :].any()
        lo, hi = int(batch.query_start[i]), int(batch.query_start[i + 1])
        assert (hi - lo, int(batch.context_lens[i])) == (count, start + count)
        assert batch.positions[lo:hi].tolist() == list(range(start, start + count))
        assert batch.token_ids[lo:hi].tolist() == seq.token_ids[start : start + count]
        slots = [table[p // size] * size + p % size for p in range(start, start + count)]
        assert batch.slot_mapping[lo:hi].tolist() == slots
        if scheduler.kv.window_blocks:
            check_window_tables(scheduler, batch, i, seq, range(start, start + count))
    assert scheduler.kv.window_blocks or batch.window_tables is None
    sampled_rows = [plan.seqs[r] for r in batch.sample_rows.tolist()]
    assert all(s is r or s in r.children for s, r in zip(plan.sampled, sampled_rows, strict=True))


def check_window_tables(scheduler: Scheduler, batch: StepBatch, i: int, seq: Sequence, new: range) -> None:
    """Row i's sliding-layer table and its new tokens' slots are the pool's; every block the sequence's queries
    read through the window is there (-1 only before it)."""
    assert batch.window_tables is not None and batch.window_slots is not None
    table, size = scheduler.kv.window_table(seq.seq_id), scheduler.kv.block_size
    assert batch.window_tables[i, : len(table)].tolist() == table
    lo, hi = int(batch.query_start[i]), int(batch.query_start[i + 1])
    assert batch.window_slots[lo:hi].tolist() == [table[p // size] * size + p % size for p in new]
    window = scheduler.kv.window.window  # type: ignore[attr-defined]  # a HybridKVCacheManager's
    read = range(max(0, new.start - window + 1) // size, -(-new.stop // size))
    assert all(table[j] >= 0 for j in read), (table, new)


def shape(plan: SchedulerPlan) -> list[tuple[int, int, int]]:
    """(seq id, first position, token count) of every scheduled sequence, in batch order."""
    return list(zip([s.seq_id for s in plan.seqs], plan.starts.tolist(), plan.counts.tolist(), strict=True))
