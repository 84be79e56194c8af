"""The async Engine on the sim backend (zero-cost profile, real clock): failures, aborts, slow readers, shutdown,
backpressure and seeded sampling. Each test runs its own event loop with asyncio.run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from backends.base import KVGeometry, StepBatch, StepOutput
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from backends.step_shape import CostCoefficients
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import SHUTDOWN_ERROR, Engine
from scheduler.errors import EngineStoppedError, QueueFullError
from scheduler.outputs import RequestOutput, RequestStream
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry.interface import NullObserver, StepRecord, TokenRecord
from tests.scheduler.engine_helpers import prompt, run
from tests.waiting import until

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 16, 1024, 4096
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)



class FlakySim:
    """The sim backend, optionally slowed down per step, raising once for the first batch holding `fail_seq`."""

    name = "sim-double"
    step_is_instant = False  # `delay` sleeps: in a worker thread, off the event loop

    def __init__(self, inner: SimBackend, delay: float = 0.0) -> None:
        self.inner = inner
        self.clock = inner.clock  # the engine reads its clock from the backend
        self.delay = delay
        self.fail_seq: int | None = None
        self.failed_batches: list[tuple[int, ...]] = []

    @property
    def kv_geometry(self) -> KVGeometry:
        return self.inner.kv_geometry

    def cost_prior(self) -> CostCoefficients:
        return self.inner.cost_prior()

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        self.inner.init_cache(num_blocks, block_size, window_blocks)

    def execute(self, batch: StepBatch) -> StepOutput:
        if self.fail_seq is not None and self.fail_seq in batch.seq_ids:
            self.fail_seq = None
            self.failed_batches.append(batch.seq_ids)
            raise RuntimeError("simulated device fault")
        if self.delay:
            time.sleep(self.delay)
        return self.inner.execute(batch)


class StepLog(NullObserver):
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        self.steps.append(step)


def sim(files: ModelFiles, delay: float = 0.0) -> FlakySim:
    inner = create(BackendConfig(name="sim", sim_profile="zero", sim_clock="real"), files)
    backend = FlakySim(inner, delay)
    backend.init_cache(NUM_BLOCKS, BLOCK_SIZE)
    return backend


def make_engine(files: ModelFiles, backend: FlakySim, observer: StepLog | None = None,
                **config: Any) -> tuple[Engine, PagedKVCacheManager]:
    kv = PagedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
    engine = Engine(SchedulerConfig(**config), kv, backend, files.tokenizer, max_model_len=MAX_LEN,
                    observer=observer)
    return engine, kv




async def read_all(stream: RequestStream) -> list[RequestOutput]:
    return [out async for out in stream]


def tokens_of(out: RequestOutput, index: int = 0) -> list[int]:
    return out.choices[index].token_ids


# --- (a) a backend exception fails only that step's requests ---------------------------------------------------
def test_backend_exception_fails_only_that_steps_requests(files: ModelFiles) -> None:
    backend = sim(files)

    async def body() -> None:
        # without re-runs: the fault fires once, so re-run in halves it would fail no one (test_step_retry.py)
        engine, kv = make_engine(files, backend, max_num_seqs=2, failed_step_retry_s=0)
        await engine.start()
        streams = [engine.submit(EngineRequest(f"r{i}", prompt(i, 40), GREEDY)) for i in range(4)]
        backend.fail_seq = engine.core.requests["r1"].seqs[0].seq_id  # r0 and r1 share the first step
        outs = await asyncio.gather(*(s.collect() for s in streams))
        assert len(backend.failed_batches) == 1
        for failed in outs[:2]:
            assert failed.finished and failed.error is not None
            assert "backend failed" in failed.error and "simulated device fault" in failed.error
            assert failed.choices[0].finish_reason == "abort"
        for ok in outs[2:]:
            assert ok.error is None and ok.choices[0].finish_reason == "length" and len(tokens_of(ok)) == 8
        assert kv.stats().used_blocks == 0
        # The engine keeps serving, and the failed step's blocks (never written) are no prefix-cache hit.
        later = await engine.submit(EngineRequest("r1-again", prompt(1, 40), GREEDY)).collect()
        assert later.error is None and len(tokens_of(later)) == 8
        assert later.cached_tokens == 0
        await engine.stop()

    run(body)


# --- (b) abort frees blocks within one step and ends the stream with "abort" -----------------------------------
def test_abort_frees_blocks_within_one_step(files: ModelFiles) -> None:
    backend = sim(files, delay=0.002)
    log = StepLog()

    async def body() -> None:
        engine, kv = make_engine(files, backend, observer=log)
        await engine.start()
        stream = engine.submit(EngineRequest("long", prompt(0, 50), SamplingParams(temperature=0.0,
                                                                                   max_tokens=2000)))
        received = 0
        steps_at_abort = -1
        outs = []
        async for out in stream:
            outs.append(out)
            received += len(tokens_of(out)) if out.choices else 0
            if received >= 5 and steps_at_abort < 0:
                assert kv.stats().used_blocks > 0
                engine.abort("long")
                steps_at_abort = len(log.steps)
                assert kv.stats().used_blocks == 0  # freed at once, even with its step still running
        last = outs[-1]
        assert last.finished and last.error is None
        assert last.choices[-1].finish_reason == "abort"
        assert received < 2000
        # Keep the engine stepping, then check the aborted request rode in at most the step in flight.
        await engine.submit(EngineRequest("after", prompt(1), GREEDY)).collect()
        later = [s for s in log.steps[steps_at_abort:] if "long" in s.request_ids]
        assert len(later) <= 1
        assert kv.stats().used_blocks == 0 and engine.stats().num_requests == 0
        # A request aborted while still waiting ends the same way.
        waiting = engine.submit(EngineRequest("queued", prompt(2), GREEDY))
        engine.abort("queued")
        end = await waiting.collect()
        assert end.finished and end.choices[0].finish_reason == "abort" and not end.choices[0].token_ids
        await engine.stop()

    run(body)


# --- (c) a slow reader gets merged deltas and does not stall the engine ----------------------------------------
def test_slow_reader_gets_merged_deltas_without_stalling_the_engine(files: ModelFiles) -> None:
    backend = sim(files, delay=0.001)
    params = SamplingParams(temperature=0.0, max_tokens=120)

    async def body() -> None:
        engine, _ = make_engine(files, backend)
        await engine.start()
        fast = engine.submit(EngineRequest("fast", prompt(7), params))
        slow = engine.submit(EngineRequest("slow", prompt(7), params))  # same prompt: same tokens
        others = [engine.submit(EngineRequest(f"o{i}", prompt(20 + i), params)) for i in range(4)]
        slow_outs: list[RequestOutput] = []
        at_others_done: list[tuple[int, bool]] = []
        others_done = asyncio.Event()

        async def read_slowly() -> None:
            async for out in slow:  # one read, then none until the others are done: as far behind as can be
                slow_outs.append(out)
                await others_done.wait()

        async def others_then_mark() -> list[RequestOutput]:
            outs = await asyncio.gather(*(o.collect() for o in others))
            at_others_done.append((len(slow_outs), slow.finished))
            others_done.set()
            return list(outs)

        fast_outs, _, other_outs = await asyncio.gather(read_all(fast), read_slowly(), others_then_mark())
        # The others (same length, same steps) were done, and the engine had finished the slow request too,
        # while its reader had taken one read: the engine never waited for it.
        [(reads_then, slow_done_then)] = at_others_done
        assert slow_done_then and reads_then == 1
        assert all(o.error is None and len(tokens_of(o)) == 120 for o in other_outs)
        fast_ids = [t for o in fast_outs for c in o.choices for t in c.token_ids]
        slow_ids = [t for o in slow_outs for c in o.choices for t in c.token_ids]
        assert slow_ids == fast_ids and len(slow_ids) == 120
        assert "".join(c.text for o in slow_outs for c in o.choices) == \
            "".join(c.text for o in fast_outs for c in o.choices)
        assert len(slow_outs) == 2 < len(fast_outs)  # the 119 tokens after the first read: one delta
        assert slow_outs[-1].finished and slow_outs[-1].choices[-1].finish_reason == "length"
        await engine.stop()

    run(body)


# --- (d) stop(drain_timeout): in-flight requests finish, the rest are aborted; no admission afterwards ---------
def test_stop_drains_then_aborts_and_refuses_new_requests(files: ModelFiles) -> None:
    backend = sim(files, delay=0.01)

    async def body() -> None:
        engine, kv = make_engine(files, backend)
        await engine.start()
        short = engine.submit(EngineRequest("short", prompt(0), SamplingParams(temperature=0.0, max_tokens=5)))
        long = engine.submit(EngineRequest("long", prompt(1), SamplingParams(temperature=0.0, max_tokens=3000)))
        stopping = asyncio.create_task(engine.stop(drain_timeout=0.6))
        await until(lambda: not engine.accepting, what="stop() has begun")
        with pytest.raises(EngineStoppedError):  # draining already admits nothing
            engine.submit(EngineRequest("late", prompt(2), GREEDY))
        short_out, long_out = await asyncio.gather(short.collect(), long.collect())
        await stopping
        assert short_out.error is None and short_out.choices[0].finish_reason == "length"
        assert len(tokens_of(short_out)) == 5
        assert long_out.error == SHUTDOWN_ERROR and long_out.choices[0].finish_reason == "abort"
        assert 0 < len(tokens_of(long_out)) < 3000
        assert kv.stats().used_blocks == 0
        with pytest.raises(EngineStoppedError):
            engine.submit(EngineRequest("after", prompt(3), GREEDY))
        assert not engine.accepting

    run(body)


# --- (e) the waiting queue is bounded ------------------------------------------------------------------------
def test_queue_bound_refuses_the_third_waiting_request(files: ModelFiles) -> None:
    backend = sim(files)

    async def body() -> None:
        engine, _ = make_engine(files, backend, max_waiting_requests=2)
        await engine.start()
        first = engine.submit(EngineRequest("a", prompt(0), GREEDY))
        second = engine.submit(EngineRequest("b", prompt(1), GREEDY))
        with pytest.raises(QueueFullError) as refused:
            engine.submit(EngineRequest("c", prompt(2), GREEDY))
        assert refused.value.retry_after > 0
        outs = await asyncio.gather(first.collect(), second.collect())
        assert all(o.error is None for o in outs)
        # Once the queue has drained, requests are admitted again.
        again = await engine.submit(EngineRequest("c", prompt(2), GREEDY)).collect()
        assert again.error is None and len(tokens_of(again)) == 8
        await engine.stop()

    run(body)


# --- (f) and (g): seeded sampling does not depend on batch company ---------------------------------------------
def generate(files: ModelFiles, requests: list[EngineRequest], **config: Any) -> dict[str, RequestOutput]:
    async def body() -> dict[str, RequestOutput]:
        engine, kv = make_engine(files, sim(files), **config)
        await engine.start()
        streams = [engine.submit(r) for r in requests]
        outs = await asyncio.gather(*(s.collect() for s in streams))
        await engine.stop()
        assert kv.stats().used_blocks == 0
        return {r.request_id: o for r, o in zip(requests, outs, strict=True)}

    return run(body)


def company(count: int) -> list[EngineRequest]:
    """Other traffic: mixed prompt lengths, greedy and sampled, seeded and not."""
    out = []
    for i in range(count):
        params = SamplingParams(temperature=0.0 if i % 3 == 0 else 0.9, seed=None if i % 2 else 1000 + i,
                                max_tokens=10 + 7 * i, n=1 + i % 2)
        out.append(EngineRequest(f"c{i}", prompt(100 + i, 5 + 37 * i % 150), params))
    return out


def test_n2_seeded_choices_are_reproducible_and_independent_of_the_batch(files: ModelFiles) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, n=2, max_tokens=24)
    req = EngineRequest("x", prompt(3, 60), params)
    alone = generate(files, [req])["x"]
    again = generate(files, [req])["x"]
    crowded = generate(files, [*company(6)[:3], req, *company(6)[3:]], max_num_batched_tokens=64)["x"]
    choices = [tokens_of(alone, i) for i in range(2)]
    assert all(len(c) == 24 for c in choices)
    assert choices[0] != choices[1]  # each choice has its own generator
    assert [tokens_of(again, i) for i in range(2)] == choices
    assert [tokens_of(crowded, i) for i in range(2)] == choices
    assert [c.text for c in crowded.choices] == [c.text for c in alone.choices]


def test_seeded_sampling_is_the_same_whatever_shares_the_batch(files: ModelFiles) -> None:
    def seeded(seed: int) -> EngineRequest:
        return EngineRequest(f"s{seed}", prompt(5, 70), SamplingParams(temperature=1.0, seed=seed, max_tokens=30))

    alone = generate(files, [seeded(123)])["s123"]
    crowded = generate(files, [*company(8), seeded(123)], max_num_batched_tokens=48, max_num_seqs=6)
    assert tokens_of(crowded["s123"]) == tokens_of(alone)
    other_seed = generate(files, [seeded(124)])["s124"]
    greedy = generate(files, [EngineRequest("g", prompt(5, 70), SamplingParams(temperature=0.0, max_tokens=30))])
    assert tokens_of(other_seed) != tokens_of(alone)  # the seed really drives the sample
    assert tokens_of(greedy["g"]) != tokens_of(alone)
