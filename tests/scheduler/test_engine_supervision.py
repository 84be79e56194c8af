"""The engine supervises its steps: a failed step fails only the requests it touches and the engine goes on;
what it cannot go on from (a hang, repeated failures, a broken state, a bug in the loop) fails the engine
once, ending every request in flight with an error. On the sim backend with injected faults."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from backends.base import StepBatch, StepOutput
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import MAX_CONSECUTIVE_FAILURES, Engine
from scheduler.errors import EngineStoppedError
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_runner import StepCrashedError, StepRunner, StepTimeoutError
from telemetry.interface import NullObserver
from tests.scheduler.engine_helpers import prompt, run

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 16, 256, 2048
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)



class Failures(NullObserver):
    def __init__(self) -> None:
        self.causes: list[str] = []

    def step_failed(self, cause: str) -> None:
        self.causes.append(cause)


def sim(files: ModelFiles, faults: str = "") -> SimBackend:
    backend = create(BackendConfig(name="sim", sim_faults=faults), files)
    backend.init_cache(NUM_BLOCKS, BLOCK_SIZE)
    return backend


def make_engine(files: ModelFiles, backend: Any, tokenizer: Any = None, step_timeout_s: float = 0.0,
                **config: Any) -> tuple[Engine, PagedKVCacheManager, Failures]:
    kv, failures = PagedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE), Failures()
    engine = Engine(SchedulerConfig(**config), kv, backend, tokenizer or files.tokenizer, max_model_len=MAX_LEN,
                    observer=failures, step_timeout_s=step_timeout_s)
    return engine, kv, failures



def submit_all(engine: Engine, count: int, params: SamplingParams = GREEDY) -> list[Any]:
    return [engine.submit(EngineRequest(f"r{i}", prompt(i), params)).collect() for i in range(count)]



def ok(out: RequestOutput, tokens: int = 6) -> bool:
    return out.error is None and len(out.choices[0].token_ids) == tokens


# --- the step runner --------------------------------------------------------------------------------------------
def test_runner_watchdog_gives_up_on_a_hung_step() -> None:
    release = threading.Event()

    def hung(batch: StepBatch) -> StepOutput:
        release.wait(30)  # held until the test ends: only the watchdog can end the wait for it
        return StepOutput(np.zeros(0, np.int64))

    async def body() -> None:
        runner = StepRunner(hung, timeout_s=0.2)
        with pytest.raises(StepTimeoutError, match="0.2 s"):
            await runner.run(None)  # type: ignore[arg-type]
        runner.close()

    try:
        run(body)
    finally:
        release.set()


@pytest.mark.parametrize("inline", [False, True])
def test_runner_turns_base_exceptions_into_a_crash(inline: bool) -> None:
    def crash(batch: StepBatch) -> StepOutput:
        raise SystemExit(7)

    async def body() -> None:
        with pytest.raises(StepCrashedError, match="SystemExit"):
            await StepRunner(crash, inline=inline).run(None)  # type: ignore[arg-type]

    run(body)


# --- failures the engine survives -------------------------------------------------------------------------------
def test_bad_token_fails_only_the_request_it_was_for(files: ModelFiles) -> None:
    async def body() -> None:
        engine, kv, failures = make_engine(files, sim(files, "bad_token@2"))
        await engine.start()
        outs = await asyncio.gather(*submit_all(engine, 3))
        bad = [o for o in outs if o.error is not None]
        assert len(bad) == 1 and "outside the vocabulary" in (bad[0].error or "")
        assert bad[0].choices[0].finish_reason == "abort"
        assert sum(ok(o) for o in outs) == 2 and failures.causes == ["bad_output"]
        assert ok(await engine.submit(EngineRequest("after", prompt(9), GREEDY)).collect())
        assert kv.stats().used_blocks == 0 and engine.failure is None
        await engine.stop()

    run(body)


class BrokenDetokenizer:
    def push(self, ids: Sequence[int]) -> str:
        raise UnicodeError("detokenizer bug")

    def push_token(self, token_id: int) -> str:
        raise UnicodeError("detokenizer bug")

    def flush(self) -> str:
        return ""


class TokenizerBreakingOnKeep:
    """The real tokenizer, except that requests asking to keep special tokens get a detokenizer that raises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.eos_token_ids, self.vocab_size = inner.eos_token_ids, inner.vocab_size

    def detokenizer(self, skip_special_tokens: bool = True) -> Any:
        return self.inner.detokenizer() if skip_special_tokens else BrokenDetokenizer()


def test_an_output_that_cannot_be_processed_fails_only_its_request(files: ModelFiles) -> None:
    async def body() -> None:
        engine, kv, failures = make_engine(files, sim(files), TokenizerBreakingOnKeep(files.tokenizer))
        await engine.start()
        victim = engine.submit(EngineRequest("victim", prompt(1), SamplingParams(
            temperature=0.0, max_tokens=6, skip_special_tokens=False))).collect()
        outs = await asyncio.gather(victim, *submit_all(engine, 2))
        assert "detokenizer bug" in (outs[0].error or "") and all(ok(o) for o in outs[1:])
        assert failures.causes == ["output_processing"] and kv.stats().used_blocks == 0
        await engine.stop()

    run(body)


def test_an_unusable_output_fails_the_step(files: ModelFiles) -> None:
    class ShortOutput:
        def __init__(self, inner: SimBackend) -> None:
            self.inner, self.name, self.steps = inner, "short", 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def execute(self, batch: StepBatch) -> StepOutput:
            self.steps += 1
            out = self.inner.execute(batch)
            return StepOutput(out.token_ids[:-1]) if self.steps == 1 else out

    async def body() -> None:
        engine, kv, failures = make_engine(files, ShortOutput(sim(files)))
        await engine.start()
        outs = await asyncio.gather(*submit_all(engine, 2))
        assert all("unusable" in (o.error or "") for o in outs) and failures.causes == ["bad_output"]
        assert ok(await engine.submit(EngineRequest("after", prompt(9), GREEDY)).collect())
        assert kv.stats().used_blocks == 0
        await engine.stop()

    run(body)


def test_a_failed_commit_with_a_sound_state_keeps_serving(files: ModelFiles, monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    async def body() -> None:
        engine, kv, failures = make_engine(files, sim(files))
        real_commit, calls = engine.core.commit, [0]

        def commit_failing_once(*args: Any) -> list[str]:
            calls[0] += 1
            if calls[0] == 2:
                raise KeyError("stop check bug")
            return real_commit(*args)

        monkeypatch.setattr(engine.core, "commit", commit_failing_once)
        await engine.start()
        outs = await asyncio.gather(*submit_all(engine, 2))
        assert all("stop check bug" in (o.error or "") for o in outs)
        assert failures.causes == ["output_processing"] and engine.failure is None
        assert ok(await engine.submit(EngineRequest("after", prompt(9), GREEDY)).collect())
        assert kv.stats().used_blocks == 0
        await engine.stop()

    run(body)


# --- failures that fail the engine ------------------------------------------------------------------------------
async def _assert_failed(engine: Engine, streams: list[Any], cause: str) -> list[RequestOutput]:
    failure = await asyncio.wait_for(engine.wait_failed(), 5)
    assert cause in failure and engine.failure == failure and not engine.accepting
    outs = await asyncio.gather(*streams)
    assert all(o.finished and o.error for o in outs)
    with pytest.raises(EngineStoppedError):
        engine.submit(EngineRequest("late", prompt(50), GREEDY))
    await engine.stop()
    return outs


def test_a_hung_step_fails_the_engine_within_the_watchdogs_limit(files: ModelFiles) -> None:
    backend = sim(files, "hang@3")

    async def body() -> None:  # the step hangs until released, after the test: only the watchdog can end it
        engine, kv, failures = make_engine(files, backend, step_timeout_s=0.3)
        await engine.start()
        outs = await _assert_failed(engine, submit_all(engine, 2), "did not finish within 0.3 s")
        assert all("the engine failed" in (o.error or "") for o in outs) and failures.causes == ["hang"]

    try:
        run(body)
    finally:
        backend.faults.release()


def test_repeated_step_failures_fail_the_engine(files: ModelFiles) -> None:
    async def body() -> None:
        engine, kv, failures = make_engine(files, sim(files, "step_error%100"), max_num_seqs=1)
        await engine.start()
        outs = await _assert_failed(engine, submit_all(engine, MAX_CONSECUTIVE_FAILURES + 2), "in a row failed")
        assert failures.causes == ["backend_error"] * MAX_CONSECUTIVE_FAILURES
        # each failed step's request ends with the step's error, those still queued with the engine's failure
        errors = [o.error or "" for o in outs]
        assert sum(e.startswith("the model backend failed") for e in errors) == MAX_CONSECUTIVE_FAILURES
        assert sum(e.startswith("the engine failed: 5 engine steps in a row") for e in errors) == 2
        assert kv.stats().used_blocks == 0

    run(body)


def test_a_step_that_raises_a_base_exception_fails_the_engine(files: ModelFiles) -> None:
    class Exiting:
        def __init__(self, inner: SimBackend) -> None:
            self.inner, self.name = inner, "exiting"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def execute(self, batch: StepBatch) -> StepOutput:
            raise SystemExit("backend called exit")

    async def body() -> None:
        engine, _, failures = make_engine(files, Exiting(sim(files)))
        await engine.start()
        await _assert_failed(engine, submit_all(engine, 2), "SystemExit")
        assert failures.causes == ["crash"]

    run(body)


def test_a_broken_state_after_a_failure_fails_the_engine(files: ModelFiles, monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    async def body() -> None:
        engine, _, _ = make_engine(files, sim(files))

        def broken(*args: Any) -> None:
            raise AssertionError("block 7 is free and held")

        monkeypatch.setattr(engine.core, "commit", lambda *args: (_ for _ in ()).throw(ValueError("bug")))
        monkeypatch.setattr(engine.core, "check_consistency", broken)
        await engine.start()
        await _assert_failed(engine, submit_all(engine, 2), "block 7 is free and held")

    run(body)


def test_a_bug_in_planning_fails_the_engine(files: ModelFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        engine, _, _ = make_engine(files, sim(files))
        streams = submit_all(engine, 2)
        monkeypatch.setattr(engine.core, "plan", lambda: (_ for _ in ()).throw(IndexError("planner bug")))
        await engine.start()
        await _assert_failed(engine, streams, "planning a step raised IndexError: planner bug")

    run(body)
