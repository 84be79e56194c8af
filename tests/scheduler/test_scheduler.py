"""Crafted scenarios: the exact batch of each step."""

from __future__ import annotations

from scheduler.sequence import SequenceStatus
from tests.scheduler.helpers import make_scheduler, make_seqs, shape, step


def test_chunked_prefill_never_stalls_running_decodes() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add(make_seqs(0, prompt_len=3, max_tokens=10))
    assert shape(step(sched)) == [(0, 0, 3)]
    sched.add(make_seqs(1, prompt_len=20, max_tokens=2))
    # seq 0 decodes first each step; the long prompt takes the rest of the budget in chunks.
    assert shape(step(sched)) == [(0, 3, 1), (1, 0, 7)]
    assert shape(step(sched)) == [(0, 4, 1), (1, 7, 7)]
    plan = step(sched)
    assert shape(plan) == [(0, 5, 1), (1, 14, 6)]
    assert [s.seq_id for s in plan.sampled] == [0, 1]  # seq 1 samples only when its prompt is complete
    assert plan.batch is not None and plan.batch.num_tokens == 7


def test_prefill_chunks_do_not_sample_until_the_prompt_is_done() -> None:
    sched = make_scheduler(max_num_batched_tokens=5)
    sched.add(make_seqs(0, prompt_len=12))
    plans = [step(sched) for _ in range(3)]
    assert [shape(p) for p in plans] == [[(0, 0, 5)], [(0, 5, 5)], [(0, 10, 2)]]
    assert [len(p.sampled) for p in plans] == [0, 0, 1]


def test_continuous_batching_fills_a_finished_slot_at_once() -> None:
    sched = make_scheduler(max_num_seqs=2)
    sched.add(make_seqs(0, 4, max_tokens=1))
    sched.add(make_seqs(1, 4, max_tokens=3))
    sched.add(make_seqs(2, 4, max_tokens=3))
    assert shape(step(sched)) == [(0, 0, 4), (1, 0, 4)]  # seq 0 is done after its first token
    assert shape(step(sched)) == [(1, 4, 1), (2, 0, 4)]


def test_static_batching_waits_for_the_whole_batch() -> None:
    sched = make_scheduler(max_num_seqs=2, batching="static")
    for i, max_tokens in enumerate((1, 3, 3)):
        sched.add(make_seqs(i, 4, max_tokens=max_tokens))
    assert shape(step(sched)) == [(0, 0, 4), (1, 0, 4)]
    assert shape(step(sched)) == [(1, 4, 1)]
    assert shape(step(sched)) == [(1, 5, 1)]
    assert shape(step(sched)) == [(2, 0, 4)]  # only once seq 1 has finished too


def test_preemption_takes_the_latest_admitted_and_resumes_it_with_its_tokens() -> None:
    # 4 blocks of 4 tokens: two 6-token prompts fit (2 blocks each); growing past 8 tokens needs a 5th block.
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=4)
    sched.add(make_seqs(0, 6, max_tokens=5))
    sched.add(make_seqs(1, 6, max_tokens=5))
    assert shape(step(sched)) == [(0, 0, 6), (1, 0, 6)]
    assert shape(step(sched)) == [(0, 6, 1), (1, 6, 1)]
    assert shape(step(sched)) == [(0, 7, 1), (1, 7, 1)]
    plan = step(sched)  # seq 0 needs a third block for position 8: seq 1 (admitted last) gives its blocks back
    assert shape(plan) == [(0, 8, 1)] and [s.seq_id for s in plan.preempted] == [1]
    seq1 = sched.waiting[0]
    assert seq1.seq_id == 1 and seq1.status is SequenceStatus.WAITING and seq1.num_computed_tokens == 0
    assert seq1.output_token_ids == [101, 101, 101]  # generated tokens survive the preemption
    while sched.running:
        step(sched)
    # seq 0 finished; seq 1 recomputes prompt + outputs in one chunk, except its first block, which the
    # prefix cache kept (its second was handed to seq 0 and so evicted).
    assert shape(step(sched)) == [(1, 4, 5)]


def test_priority_policy_admits_and_preempts_by_priority() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=1, scheduling="priority")
    sched.add(make_seqs(0, 4, priority=5, max_tokens=1))
    sched.add(make_seqs(1, 4, priority=1, max_tokens=1))
    sched.add(make_seqs(2, 4, priority=3, max_tokens=1))
    assert [shape(step(sched)) for _ in range(3)] == [[(1, 0, 4)], [(2, 0, 4)], [(0, 0, 4)]]


def test_priority_preemption_victim_is_lowest_priority() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, scheduling="priority")
    sched.add(make_seqs(0, 6, priority=0, max_tokens=8))
    sched.add(make_seqs(1, 6, priority=9, max_tokens=8, arrival=-1.0))  # earlier, but lower priority
    for _ in range(3):
        assert not step(sched).preempted
    assert [s.seq_id for s in step(sched).preempted] == [1]


def test_prefix_cache_hit_skips_computed_blocks() -> None:
    sched = make_scheduler(block_size=4)
    first = make_seqs(0, 10, max_tokens=1)
    sched.add(first)
    step(sched)
    second = make_seqs(5, 10, max_tokens=1)
    second[0].token_ids = list(first[0].token_ids[:10])  # same prompt
    sched.add(second)
    assert shape(step(sched)) == [(5, 8, 2)]  # two full blocks (8 tokens) come from the cache
    assert second[0].num_cached_tokens == 8


def test_abort_frees_blocks_at_once() -> None:
    sched = make_scheduler(num_blocks=8)
    seqs = make_seqs(0, 10, max_tokens=50)
    sched.add(seqs)
    step(sched)
    assert sched.kv.stats().used_blocks == 3
    sched.finish(seqs[0], SequenceStatus.FINISHED_ABORTED)
    assert sched.kv.stats().used_blocks == 0 and not sched.has_work
    sched.kv.check_invariants()


def test_n_choices_fork_after_the_prompt_and_copy_on_write() -> None:
    sched = make_scheduler(block_size=4)
    seqs = make_seqs(0, 6, n=3, max_tokens=3)
    sched.add(seqs)
    plan = step(sched)
    assert shape(plan) == [(0, 0, 6)] and [s.seq_id for s in plan.sampled] == [0, 1, 2]
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 3
    assert sched.kv.stats().used_blocks == 2  # the prompt's blocks are shared three ways
    plan = step(sched)
    assert shape(plan) == [(0, 6, 1), (1, 6, 1), (2, 6, 1)]
    assert plan.batch is not None and len(plan.batch.block_copies) == 2  # two writers copy the shared tail
    assert all(s.output_token_ids[0] == 100 + s.seq_id for s in seqs)


def test_context_length_ends_a_sequence() -> None:
    sched = make_scheduler(max_model_len=8)
    seqs = make_seqs(0, 6, max_tokens=100)
    sched.add(seqs)
    while sched.has_work:
        step(sched)
    assert seqs[0].status is SequenceStatus.FINISHED_LENGTH and seqs[0].num_tokens == 8


def test_eos_stops_but_not_before_min_tokens_or_with_ignore_eos() -> None:
    sched = make_scheduler()
    seqs = make_seqs(0, 4, max_tokens=10)
    sched.add(seqs)
    step(sched, token_of=lambda s: 2)
    assert seqs[0].status is SequenceStatus.FINISHED_STOPPED and seqs[0].output_token_ids == [2]
