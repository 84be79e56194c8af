"""A failed step of several requests is re-run in halves (scheduler/step_retry.py): the request that made it
fail fails alone, the others get exactly the tokens they get alone; a passing fault fails no one; two causes
fail both halves. On the real model (a poisoned request inside chunked prefill, greedy and seeded sampling)
and on the sim backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from backends.base import SamplingInputs, StepBatch, StepOutput
from backends.model.loader import LoadedModel, ModelFiles
from backends.numpy_backend.backend import NumpyBackend
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import Engine
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_retry import merged_output, sub_batch, units_of
from tests.scheduler.engine_helpers import prompt, run
from tests.scheduler.test_engine_supervision import Failures, sim

BLOCK = 16


class Poisoned:
    """A backend that raises on every step carrying one of `poisons` (sequence ids), and counts its calls."""

    def __init__(self, inner: Any, poisons: set[int]) -> None:
        self.inner, self.poisons, self.calls = inner, poisons, 0
        self.name = "poisoned"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, batch: StepBatch) -> StepOutput:
        self.calls += 1
        if self.poisons & set(batch.seq_ids):
            raise ValueError(f"cannot take sequence {sorted(self.poisons & set(batch.seq_ids))}")
        return self.inner.execute(batch)


def engine_over(backend: Any, tokenizer: Any, blocks: int = 160, **config: Any) -> tuple[Engine, Failures]:
    failures = Failures()
    engine = Engine(SchedulerConfig(**config), PagedKVCacheManager(blocks, BLOCK), backend, tokenizer,
                    max_model_len=2048, observer=failures)
    return engine, failures


async def generate(engine: Engine, prompts: list[tuple[int, ...]], params: list[SamplingParams]
                   ) -> list[RequestOutput]:
    await engine.start()
    streams = [engine.submit(EngineRequest(f"r{i}", p, q)).collect()
               for i, (p, q) in enumerate(zip(prompts, params, strict=True))]
    outs = await asyncio.gather(*streams)
    await engine.stop()
    return list(outs)


# --- on the real model ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(real_model: LoadedModel) -> LoadedModel:
    return real_model  # loaded once for the session (tests/conftest.py)


def test_a_poisoned_request_fails_alone_and_the_rest_get_their_own_tokens(model: LoadedModel) -> None:
    tokenizer = model.files.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Water boils at",
             "The quick brown fox jumps over the lazy dog, and then", "1, 2, 3, 4,", "Dear Sir or Madam,", "Rain is"]
    prompts = [tuple(tokenizer.encode(t)) for t in texts]
    params = [SamplingParams(temperature=0.0, max_tokens=6) if i % 2 else
              SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=6) for i in range(len(texts))]

    backend = NumpyBackend(model)
    backend.init_cache(160, BLOCK)

    async def alone(i: int) -> list[int]:
        engine, _ = engine_over(backend, tokenizer)
        return list((await generate(engine, [prompts[i]], [params[i]]))[0].choices[0].token_ids)

    expected = [run(lambda i=i: alone(i), timeout=60) for i in range(len(texts))]
    poisoned = Poisoned(backend, {5})
    # 12-token steps: prompts are prefilled in chunks beside decodes, so the poison meets rows of every kind
    engine, failures = engine_over(poisoned, tokenizer, max_num_batched_tokens=12)
    outs = run(lambda: generate(engine, prompts, params), timeout=60)
    assert "cannot take sequence [5]" in (outs[5].error or "") and outs[5].choices[0].finish_reason == "abort"
    for i, out in enumerate(outs):
        if i != 5:
            assert out.error is None and list(out.choices[0].token_ids) == expected[i], i
    assert failures.causes == ["backend_error"]  # one step failed; its re-runs cleared the others
    assert engine.core.kv.stats().used_blocks == 0


# --- on the sim backend ---------------------------------------------------------------------------------------------
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def sim_outputs(files: ModelFiles, faults: str, count: int, **config: Any) -> tuple[list[RequestOutput], Any, Failures]:
    backend = Poisoned(sim(files, faults), set())
    engine, failures = engine_over(backend, files.tokenizer, **config)
    outs = run(lambda: generate(engine, [prompt(i) for i in range(count)], [GREEDY] * count))
    assert engine.core.kv.stats().used_blocks == 0 and engine.failure is None
    return outs, backend, failures


def test_a_passing_fault_fails_no_one(files: ModelFiles) -> None:
    clean, _, _ = sim_outputs(files, "", 6)
    outs, backend, failures = sim_outputs(files, "step_error@2", 6)
    assert [o.choices[0].token_ids for o in outs] == [o.choices[0].token_ids for o in clean]
    assert all(o.error is None for o in outs) and failures.causes == ["backend_error"]
    assert backend.calls == 6 + 2  # six steps (the second failed) and the failed one's two halves


def test_passing_faults_count_for_health_but_not_in_a_row(files: ModelFiles) -> None:
    backend = Poisoned(sim(files, "step_error@2,step_error@5,step_error@8,step_error@11,step_error@14"), set())
    engine, failures = engine_over(backend, files.tokenizer)
    outs = run(lambda: generate(engine, [prompt(i) for i in range(4)], [GREEDY] * 4))
    assert all(o.error is None for o in outs) and engine.failure is None  # 5 failed steps, none in a row
    assert failures.causes == ["backend_error"] * 5
    assert engine.degraded() == "5 of the 6 engine steps of the last 30 s failed"  # the backend's, nobody's


def test_the_search_halves_down_to_the_poisoned_request(files: ModelFiles) -> None:
    outs, backend, failures = sim_outputs(files, "poison@6", 8)
    assert [i for i, o in enumerate(outs) if o.error] == [6] and "injected poison" in (outs[6].error or "")
    assert failures.causes == ["backend_error"]
    assert backend.calls == 6 + 2 * 3  # six steps (the first failed), three rounds of halves (8 -> 4 -> 2 -> 1)


def test_two_causes_fail_both_halves(files: ModelFiles) -> None:
    outs, _, failures = sim_outputs(files, "poison@1,poison@6", 8)
    assert all(o.error for o in outs)  # 1 and 6 fall in different halves: both fail, so every request of both
    assert failures.causes == ["backend_error"]


def test_retry_off_fails_the_whole_step(files: ModelFiles) -> None:
    outs, backend, _ = sim_outputs(files, "step_error@2", 6, failed_step_retry_s=0)
    assert all(o.error for o in outs) and backend.calls == 2


def test_an_expired_deadline_fails_the_suspects(files: ModelFiles) -> None:
    outs, _, _ = sim_outputs(files, "poison@6,hang:0.3@2", 8, failed_step_retry_s=0.1)
    # the first round (its first half held for 0.3 s) outlasts the deadline: the failing half's four all fail
    assert [i for i, o in enumerate(outs) if o.error] == [4, 5, 6, 7]


# --- the parts ------------------------------------------------------------------------------------------------------
def batch_of(tables: list[list[int]], counts: list[int], context: list[int], sample: list[int]) -> StepBatch:
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for n, c in zip(counts, context, strict=True)]).astype(np.int32)
    rows = np.repeat(np.arange(len(counts)), counts)
    table = np.array(tables, np.int32)
    slots = (table[rows, positions // BLOCK].astype(np.int64) * BLOCK + positions % BLOCK)
    size = len(sample)
    sampling = SamplingInputs(np.linspace(0, 1, size, dtype=np.float32), np.arange(size, dtype=np.int32),
                              np.ones(size, np.float32), np.zeros(size, np.float32),
                              np.linspace(0.1, 0.9, size, dtype=np.float32),
                              output_token_ids=np.arange(size * 2, dtype=np.int64).reshape(size, 2))
    return StepBatch(tuple(range(10, 10 + len(counts))), np.arange(int(starts[-1]), dtype=np.int32) + 100, positions,
                     slots, starts, np.array(context, np.int32), table, np.array(sample, np.int32), sampling,
                     block_copies=((1, 5), (2, 9)))


def test_rows_reading_a_block_another_row_writes_stay_together() -> None:
    # row 0 fills block 3 (positions 16-19); row 1 hits it as a prefix-cache block; row 2 shares only block 1,
    # which nobody writes; rows 3 and 4 are one request's choices
    batch = batch_of([[1, 3], [1, 3], [1, 4], [6, 7], [8, 9]], [4, 1, 1, 1, 1], [20, 21, 20, 20, 20],
                     [0, 1, 2, 3, 4])
    units = units_of(batch, ["a", "b", "c", "d", "d"], BLOCK)
    assert sorted(units) == [(0, 1), (2,), (3, 4)]


def with_window_pool(batch: StepBatch, tables: list[list[int]]) -> StepBatch:
    """The batch with its sliding layers' tables in a pool of their own (-1: given back), slots read off them."""
    table = np.array(tables, np.int32)
    rows = np.repeat(np.arange(batch.num_seqs), np.diff(batch.query_start))
    slots = table[rows, batch.positions // BLOCK].astype(np.int64) * BLOCK + batch.positions % BLOCK
    return replace(batch, window_tables=table, window_slots=slots, window_block_copies=((0, 6), (3, 7)))


def test_rows_reading_a_window_block_another_row_writes_stay_together() -> None:
    # the full tables share nothing written; in the window pool row 1 hits the block row 0 fills (6)
    batch = with_window_pool(batch_of([[1, 3], [2, 4], [5, 7]], [4, 1, 1], [20, 21, 20], [0, 1, 2]),
                             [[-1, 6], [-1, 6], [2, 8]])
    assert sorted(units_of(batch, ["a", "b", "c"], BLOCK)) == [(0, 1), (2,)]


def test_a_sub_batch_keeps_its_rows_window_tables_slots_and_copies() -> None:
    batch = with_window_pool(batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 2], [20, 17, 20], [0, 1, 2]),
                             [[-1, 6], [3, 7], [-1, 8]])
    part = sub_batch(batch, np.array([0, 2]), BLOCK)
    assert part.window_tables is not None and part.window_slots is not None and batch.window_slots is not None
    assert part.window_tables.tolist() == [[-1, 6], [-1, 8]]
    assert part.window_slots.tolist() == batch.window_slots[[0, 1, 2, 3, 5, 6]].tolist()
    assert part.window_block_copies == ((0, 6),)  # the copy into 7 is row 1's
    assert sub_batch(batch, np.array([1]), BLOCK).window_block_copies == ((3, 7),)


def test_a_sub_batch_is_the_step_restricted_to_its_rows() -> None:
    batch = batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 2], [20, 17, 20], [0, 1, 2])
    part = sub_batch(batch, np.array([0, 2]), BLOCK)
    assert part.seq_ids == (10, 12) and part.query_start.tolist() == [0, 4, 6]
    assert part.token_ids.tolist() == [100, 101, 102, 103, 105, 106]
    assert part.positions.tolist() == [16, 17, 18, 19, 18, 19]
    assert part.slot_mapping.tolist() == batch.slot_mapping[[0, 1, 2, 3, 5, 6]].tolist()
    assert part.block_tables.tolist() == [[1, 3], [4, 9]] and part.context_lens.tolist() == [20, 20]
    assert part.sample_rows.tolist() == [0, 1] and part.block_copies == ((2, 9),)  # block 5 is row 1's
    assert part.sampling is not None and batch.sampling is not None
    assert part.sampling.uniforms.tolist() == batch.sampling.uniforms[[0, 2]].tolist()
    assert part.sampling.output_token_ids is not None
    assert part.sampling.output_token_ids.tolist() == [[0, 1], [4, 5]]


def test_a_part_that_samples_nothing_has_no_sampling_inputs() -> None:
    batch = batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 2], [20, 17, 20], [1, 2])
    assert sub_batch(batch, np.array([0]), BLOCK).sampling is None
    part = sub_batch(batch, np.array([1]), BLOCK)
    assert part.sampling is not None and part.sample_rows.tolist() == [0]


def test_merged_logprobs_come_from_the_parts_that_have_them() -> None:
    batch = batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 2], [20, 17, 20], [1, 2])
    nothing_sampled = StepOutput(np.zeros(0, np.int64))
    sampled = StepOutput(np.array([7, 9]), np.array([-0.5, -0.25], np.float32), np.ones((2, 3), np.int64),
                         np.full((2, 3), -1.0, np.float32))
    merged = merged_output(batch, [(np.array([0]), nothing_sampled), (np.array([1, 2]), sampled)])
    assert merged.token_ids.tolist() == [7, 9] and merged.logprobs is not None
    assert merged.logprobs.tolist() == [-0.5, -0.25] and merged.top_token_ids is not None
    assert merged.top_token_ids.shape == (2, 3)
    narrower = StepOutput(np.array([5]), np.array([-1.0], np.float32), np.ones((1, 2), np.int64))
    with pytest.raises(ValueError):  # parts that disagree on a width do not merge
        merged_output(batch, [(np.array([1, 2]), sampled), (np.array([0, 1]), narrower)])


def test_parts_merge_into_the_steps_order() -> None:
    batch = batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 2], [20, 17, 20], [0, 1, 2])
    first = StepOutput(np.array([7, 9]), np.array([-0.5, -0.25], np.float32))
    merged = merged_output(batch, [(np.array([0, 2]), first)])
    assert merged.token_ids.tolist() == [7, 0, 9] and merged.logprobs is not None
    assert merged.logprobs.tolist() == [-0.5, 0.0, -0.25]


def test_a_sub_batch_keeps_its_rows_guessed_positions() -> None:
    """A sequence verifying guesses samples several positions (sample_lag): a part keeps each one's lag."""
    batch = replace(batch_of([[1, 3], [2, 5], [4, 9]], [4, 1, 3], [20, 17, 20], [0, 1, 2, 2, 2]),
                    sample_lag=np.array([0, 0, 2, 1, 0], np.int32))
    part = sub_batch(batch, np.array([1, 2]), BLOCK)
    assert part.sample_rows.tolist() == [0, 1, 1, 1] and part.sample_lag is not None
    assert part.sample_lag.tolist() == [0, 2, 1, 0]
    assert part.sample_token_rows().tolist() == [0, 1, 2, 3]  # row 1's one token, then row 2's three
    merged = merged_output(batch, [(np.array([1, 2]), StepOutput(np.array([5, 6, 7, 8]))),
                                   (np.array([0]), StepOutput(np.array([4])))])
    assert merged.token_ids.tolist() == [4, 5, 6, 7, 8]
