"""What the KV pool can hold bounds what is admitted, and preemption is bounded: nothing loops forever."""

from __future__ import annotations

import random

import pytest

from scheduler.core import EngineCore
from scheduler.errors import KV_CACHE_EXHAUSTED, PromptTooLongError
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.sequence import SequenceStatus
from tests.scheduler.fake_model import PositionBackend, make_core, run_step
from tests.scheduler.helpers import make_scheduler, make_seqs, step


def request(rid: str, prompt_len: int, max_tokens: int | None, n: int = 1) -> EngineRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, n=n, ignore_eos=True)
    return EngineRequest(rid, tuple(100 + i for i in range(prompt_len)), params)


def run_all(core: EngineCore, limit: int = 500) -> int:
    backend = PositionBackend()
    for steps in range(limit):
        if not core.has_work:
            return steps
        assert run_step(core, backend), "work that cannot be scheduled"
        core.kv.check_invariants()
    raise AssertionError(f"still working after {limit} steps")


def finished(stream_output: RequestOutput) -> list[tuple[str | None, int]]:
    return [(c.finish_reason, len(c.token_ids)) for c in stream_output.choices]


# --- admission ---------------------------------------------------------------------------------------------
def test_a_request_the_pool_can_never_hold_is_refused_and_the_next_one_runs() -> None:
    core = make_core(num_blocks=4, block_size=16, max_model_len=2048)  # 64 tokens of KV, a 2048-token context
    with pytest.raises(PromptTooLongError, match="at most 64 tokens") as refused:
        core.add_request(request("big", 40, 100))
    assert refused.value.param == "max_tokens" and "140" in str(refused.value)
    assert not core.has_work and not core.requests
    small = core.add_request(request("small", 2, 5))
    run_all(core)
    assert finished(small.take_finished()) == [("length", 5)]


def test_a_prompt_that_fills_the_pool_is_refused_naming_the_prompt() -> None:
    core = make_core(num_blocks=4, block_size=16, max_model_len=2048)
    with pytest.raises(PromptTooLongError, match="at most 64 tokens") as refused:
        core.add_request(request("r", 64, None))
    assert refused.value.param == "prompt"
    core.add_request(request("fits", 63, 1))  # exactly the pool, with the one token to generate


def test_the_context_still_bounds_the_prompt_first() -> None:
    core = make_core(num_blocks=64, block_size=16, max_model_len=32)
    with pytest.raises(PromptTooLongError, match="context length is 32") as refused:
        core.add_request(request("r", 32, 1))
    assert refused.value.param == "prompt"


def test_without_max_tokens_a_request_runs_to_the_pools_size_and_ends_by_length() -> None:
    core = make_core(num_blocks=4, block_size=16, max_model_len=2048)
    stream = core.add_request(request("r", 40, None))
    run_all(core)
    assert finished(stream.take_finished()) == [("length", 24)]  # 40 + 24 = 64 tokens, the whole pool
    assert core.kv.stats().used_blocks == 0


def test_the_context_caps_when_it_is_the_smaller() -> None:
    core = make_core(num_blocks=64, block_size=4, max_model_len=20)
    stream = core.add_request(request("r", 5, None))
    run_all(core)
    assert finished(stream.take_finished()) == [("length", 15)]


def test_a_contiguous_table_grows_past_its_reservation_up_to_the_pool() -> None:
    # Each sequence reserves 2 blocks (the pool's 8-token context); a lone one still reaches all 4 blocks.
    core = make_core(num_blocks=4, block_size=4, max_model_len=512, kv_layout="contiguous", kv_max_model_len=8)
    with pytest.raises(PromptTooLongError, match="at most 16 tokens"):
        core.add_request(request("big", 6, 11))
    stream = core.add_request(request("r", 6, 10))
    run_all(core)
    assert finished(stream.take_finished()) == [("length", 10)]


# --- the preemption bound ----------------------------------------------------------------------------------
def test_a_sequence_preempted_past_the_bound_fails_and_frees_its_blocks() -> None:
    # 4 blocks of 4: two 6-token prompts fit; at position 8 seq 0 needs a third block and seq 1 must go.
    sched = make_scheduler(num_blocks=4, block_size=4, max_preemptions=0)
    first, second = make_seqs(0, 6, max_tokens=5), make_seqs(1, 6, max_tokens=5)
    sched.add(first)
    sched.add(second)
    plans = [step(sched) for _ in range(4)]
    assert [s.seq_id for s in plans[-1].failed] == [1] and not plans[-1].preempted
    assert second[0].status is SequenceStatus.FINISHED_ABORTED and not sched.kv.has_sequence(1)
    assert second[0].num_preemptions == 0 and not sched.waiting


def test_preemptions_under_the_bound_recompute() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, max_preemptions=1)
    sched.add(make_seqs(0, 6, max_tokens=5))
    second = make_seqs(1, 6, max_tokens=5)
    sched.add(second)
    while sched.has_work:
        assert not step(sched).failed
    assert second[0].num_preemptions == 1 and second[0].status is SequenceStatus.FINISHED_LENGTH


def test_n_choices_that_together_overfill_the_pool_take_turns() -> None:
    """Two choices of 16 tokens in a 16-token pool: the second waits for the first, then is recomputed."""
    core = make_core(num_blocks=4, block_size=4, max_num_seqs=4)
    stream = core.add_request(request("r", 6, 10, n=2))
    behind = core.add_request(request("behind", 3, 2))
    run_all(core)
    assert finished(stream.take_finished()) == [("length", 10), ("length", 10)]
    assert finished(behind.take_finished()) == [("length", 2)]


def test_a_request_over_the_bound_fails_whole_with_a_retryable_code_and_the_queue_moves_on() -> None:
    core = make_core(num_blocks=4, block_size=4, max_num_seqs=4, max_preemptions=0)
    stream = core.add_request(request("r", 6, 10, n=2))
    behind = core.add_request(request("behind", 3, 2))
    run_all(core)
    out = stream.take_finished()
    assert out.error_code == KV_CACHE_EXHAUSTED and out.error is not None and "too small" in out.error
    assert [c.finish_reason for c in out.choices] == ["abort", "abort"]
    assert finished(behind.take_finished()) == [("length", 2)]
    assert core.kv.stats().used_blocks == 0 and not core.requests


@pytest.mark.parametrize("num_blocks", [4, 8, 12])
@pytest.mark.parametrize("scheduling", ["fcfs", "priority"])
def test_the_default_bound_is_a_backstop_not_a_limit_on_busy_pools(num_blocks: int, scheduling: str) -> None:
    """30 requests at once, each up to the whole pool, 1-3 choices: many preemptions, no sequence near 8."""
    rng = random.Random(num_blocks)
    core = make_core(num_blocks, block_size=4, max_num_seqs=8, max_num_batched_tokens=16, scheduling=scheduling)
    capacity = core.kv.max_sequence_tokens
    states = []
    for i in range(30):
        prompt_len = rng.randint(1, capacity - 1)
        params = SamplingParams(max_tokens=rng.randint(1, capacity - prompt_len), n=rng.randint(1, 3),
                                ignore_eos=True)
        prompt = tuple(100 + rng.randint(0, 5) for _ in range(prompt_len))
        core.add_request(EngineRequest(f"r{i}", prompt, params, priority=rng.randint(0, 3)))
        states.append(core.requests[f"r{i}"])
    run_all(core, 20_000)
    preemptions = [seq.num_preemptions for state in states for seq in state.seqs]
    assert sum(preemptions) > 10 and max(preemptions) <= 5
    assert all(state.stream.take_finished().error is None for state in states)
