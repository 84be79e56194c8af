"""The scheduler's persistent rows: block tables, sampling columns with uniforms drawn ahead, stop pre-checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import SamplingInputs, StepOutput
from scheduler.block_table import BlockTable, grown
from scheduler.params import SamplingParams
from scheduler.persistent_batch import RowMismatchError
from scheduler.sampling_inputs import AHEAD, SamplingColumns
from scheduler.scheduler import Scheduler
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.stop import StopColumns, check_token_stop
from tests.scheduler.helpers import EOS, make_scheduler, make_seqs, step


def test_block_table_rows_patches_and_gathers() -> None:
    table = BlockTable()
    table.set_row(3, [7, 8])
    table.set_row(0, list(range(20)))  # wider than the table: it grows
    table.patch(np.array([3, 3]), np.array([2, 1]), np.array([9, 5]))  # a new block and a copy-on-write
    assert table.row(3) == [7, 5, 9] and table.row(0) == list(range(20))
    padded = table.padded(np.array([3]))
    assert padded.tolist() == [[7, 5, 9]]
    padded[0, 0] = 99  # a fresh array: the next step's table is unaffected
    assert table.row(3)[0] == 7
    assert table.slots(np.array([3, 3, 0]), np.array([0, 9, 17], np.int32), 4).tolist() == [7 * 4, 9 * 4 + 1, 4 * 4 + 1]
    table.clear_row(0)
    table.set_row(0, [4])
    assert table.padded(np.array([0, 3])).tolist() == [[4, 0, 0], [7, 5, 9]]


def test_grown_keeps_contents_and_doubles() -> None:
    array = np.arange(6).reshape(2, 3)
    bigger = grown(array, 3, 4)
    assert bigger.shape == (4, 6) and bigger[:2, :3].tolist() == array.tolist() and not bigger[2:].any()
    assert grown(array, 2, 3) is array


def seeded(seq_id: int, prompt: list[int], params: SamplingParams, seed: int, index: int = 0) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id - index}", index=index, prompt_len=len(prompt),
                    token_ids=list(prompt), params=params, arrival_time=float(seq_id),
                    rng=np.random.default_rng([seed, index]))


def test_each_sequence_gets_its_generators_draws_in_order_across_preemption() -> None:
    """Uniforms are drawn ahead per row, but a sequence's i-th uniform is still its generator's i-th draw: through
    preemption (its unused draws go with it), forks (a choice's first draw comes before it has a row) and refills."""
    sched = make_scheduler(num_blocks=30, block_size=4, max_num_seqs=6)  # one fits, four do not
    params = SamplingParams(temperature=0.8, max_tokens=AHEAD + 6, n=2, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=AHEAD + 6, ignore_eos=True)
    sched.add([seeded(0, [5] * 6, params, 11), seeded(1, [5] * 6, params, 11, index=1)])
    sched.add([seeded(2, [6] * 6, greedy, 0)])
    sched.add([seeded(3, [7] * 5, SamplingParams(temperature=1.0, max_tokens=AHEAD + 6), 12)])
    seen: dict[int, list[float]] = {}
    preempted = 0
    while sched.has_work:
        plan = step(sched, token_of=lambda s: 20 + s.seq_id)
        preempted += len(plan.preempted)
        if plan.batch is not None and plan.batch.sampling is not None:
            for seq, u in zip(plan.sampled, plan.batch.sampling.uniforms.tolist(), strict=True):
                seen.setdefault(seq.seq_id, []).append(u)
    assert preempted, "the pool is small enough to preempt"
    for seq_id, seed, index in ((0, 11, 0), (1, 11, 1), (3, 12, 0)):
        reference = np.random.default_rng([seed, index]).random(len(seen[seq_id])).astype(np.float32)
        assert seen[seq_id] == reference.tolist(), seq_id
        assert len(seen[seq_id]) > AHEAD  # refilled at least once
    assert set(seen[2]) == {0.0}


def reference_inputs(seqs: list[Sequence], eos_ids: frozenset[int]) -> dict[str, object]:
    """What the per-sequence builder this replaced produced (uniforms aside)."""
    params = [s.params for s in seqs]
    pen = any(p.uses_penalties for p in params)

    def padded(lists: list[list[int]]) -> list[list[int]]:
        width = max((len(x) for x in lists), default=0) or 1
        return [x + [-1] * (width - len(x)) for x in lists]

    def banned(s: Sequence) -> list[int]:
        if s.num_output_tokens >= s.params.min_tokens:
            return []
        return sorted(set(s.params.stop_token_ids) | (set() if s.params.ignore_eos else eos_ids))

    bans = [banned(s) for s in seqs]
    return {
        "temperature": np.array([p.temperature for p in params], np.float32).tolist(),
        "top_k": [p.top_k for p in params], "top_p": np.array([p.top_p for p in params], np.float32).tolist(),
        "min_p": np.array([p.min_p for p in params], np.float32).tolist(),
        "presence_penalty": np.array([p.presence_penalty for p in params], np.float32).tolist() if pen else None,
        "frequency_penalty": np.array([p.frequency_penalty for p in params], np.float32).tolist() if pen else None,
        "repetition_penalty": np.array([p.repetition_penalty for p in params], np.float32).tolist() if pen else None,
        "output_token_ids": padded([s.output_token_ids for s in seqs]) if pen else None,
        "prompt_token_ids": padded([s.token_ids[: s.prompt_len] for s in seqs]) if pen else None,
        "suppressed_token_ids": padded(bans) if any(p.min_tokens for p in params) and any(bans) else None,
        "num_top_logprobs": max(p.top_logprobs for p in params), "want_logprobs": any(p.logprobs for p in params),
        "allowed": None,  # no grammar among these parameters
    }


def as_lists(inputs: SamplingInputs) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in vars(inputs).items():
        if name != "uniforms":
            out[name] = value.tolist() if isinstance(value, np.ndarray) else value
    return out


PARAMS = st.builds(
    SamplingParams, temperature=st.sampled_from([0.0, 0.7]), top_k=st.sampled_from([0, 5]),
    top_p=st.sampled_from([1.0, 0.9]), min_p=st.sampled_from([0.0, 0.1]),
    presence_penalty=st.sampled_from([0.0, 0.0, 0.5]), repetition_penalty=st.sampled_from([1.0, 1.0, 1.2]),
    max_tokens=st.integers(3, 8), min_tokens=st.sampled_from([0, 0, 2]),
    stop_token_ids=st.sampled_from([(), (60,), (61, 60)]), ignore_eos=st.booleans(), logprobs=st.booleans(),
    top_logprobs=st.sampled_from([0, 0, 3]))


@settings(max_examples=60, deadline=None)
@given(st.lists(PARAMS, min_size=1, max_size=5))
def test_sampling_inputs_match_the_per_sequence_builder(all_params: list[SamplingParams]) -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=12)
    for i, params in enumerate(all_params):
        sched.add([seeded(i, [10 + i] * (3 + i), params, i)])
    for _ in range(12):
        if not sched.has_work:
            break
        plan = sched.schedule()
        if plan.batch is not None and plan.batch.sampling is not None:
            assert as_lists(plan.batch.sampling) == reference_inputs(plan.sampled, sched.eos_ids)
        sched.update(plan, _output(len(plan.sampled)))


def _output(rows: int) -> StepOutput:
    return StepOutput(np.full(rows, 30, np.int64))


@settings(max_examples=300, deadline=None)
@given(PARAMS, st.integers(1, 6), st.integers(1, 9), st.sampled_from([EOS, 30, 60, 61]), st.integers(6, 20))
def test_the_stop_pre_check_never_misses_a_stop(params: SamplingParams, prompt_len: int, produced: int, token: int,
                                               max_model_len: int) -> None:
    seq = seeded(0, [9] * prompt_len, params, 0)
    seq.token_ids += [30] * (produced - 1) + [token]
    columns = StopColumns(frozenset({EOS}), max_model_len)
    columns.set_row(5, seq)
    maybe = columns.candidates(np.array([5]), np.array([token]), np.array([seq.num_tokens]))
    if check_token_stop(seq, frozenset({EOS}), max_model_len) is not None:
        assert maybe[0]


def test_sampling_columns_reuse_the_gather_only_for_the_same_rows() -> None:
    columns = SamplingColumns()
    seqs = [seeded(i, [1, 2], SamplingParams(temperature=0.0, top_k=i), 0) for i in range(3)]
    for row, seq in enumerate(seqs):
        columns.set_row(row, seq)
    first = columns.inputs(np.array([0, 1, 2]), seqs, [], frozenset(), 1, seqs)
    again = columns.inputs(np.array([0, 1, 2]), seqs, [], frozenset(), 1, seqs)
    other = columns.inputs(np.array([2, 0]), [seqs[2], seqs[0]], [], frozenset(), 1, seqs)
    assert again.top_k is first.top_k and other.top_k.tolist() == [2, 0]
    assert not first.top_k.flags.writeable  # shared between steps, so read-only
    assert columns.inputs(np.array([0, 1, 2]), seqs, [], frozenset(), 2, seqs).top_k is not first.top_k


def test_a_finished_sequence_keeps_no_row() -> None:
    sched = make_scheduler()
    seq = seeded(0, [4, 5, 6], SamplingParams(temperature=0.5, max_tokens=2), 3)
    sched.add([seq])
    step(sched)
    assert sched.rows.seqs[seq.row] is seq
    step(sched)
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.row == -1 and seq not in sched.rows.seqs


def test_a_sequence_counts_its_computed_tokens_through_its_row() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    seq = make_seqs(0, 6, max_tokens=2)[0]
    sched.add([seq])
    assert seq.num_computed_tokens == 0  # waiting: no row, no KV
    step(sched)
    assert seq.num_computed_tokens == 4 == sched.rows.computed[seq.row]  # the first chunk
    step(sched)
    assert seq.num_computed_tokens == 6 and seq.num_tokens == 7
    step(sched)
    assert seq.status.finished and seq.num_computed_tokens == 0  # its KV went back with its row


def _drop_a_running_sequence(sched: Scheduler) -> None:
    sched.running.pop()


def _move_a_block(sched: Scheduler) -> None:
    sched.rows.blocks.table[sched.running[0].row, 0] += 1


def _compute_past_the_blocks(sched: Scheduler) -> None:
    sched.rows.computed[sched.running[0].row] = sched.running[0].num_tokens + 1


def _append_behind_the_rows(sched: Scheduler) -> None:
    sched.running[0].token_ids.append(30)


@pytest.mark.parametrize(("corrupt", "named"), [
    (_drop_a_running_sequence, "exactly the running sequences"), (_move_a_block, "KV pool"),
    (_compute_past_the_blocks, "computed tokens"), (_append_behind_the_rows, r"row has \(prompt, tokens, last\)")])
def test_the_row_check_names_each_mismatch(corrupt: Callable[[Scheduler], None], named: str) -> None:
    sched = make_scheduler()
    sched.add(make_seqs(0, 5))
    sched.add(make_seqs(1, 6))
    step(sched)
    corrupt(sched)
    with pytest.raises(RowMismatchError, match=named):
        sched.check_rows()
