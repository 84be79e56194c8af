"""scheduler.debug_checks: after every step the engine checks its rows against the sequences and the KV pool, and
the pool's invariants, and fails on a mismatch that would otherwise go unnoticed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from backends.base import StepBatch, StepOutput
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import Engine
from scheduler.llm import LLM
from scheduler.params import SamplingParams
from scheduler.persistent_batch import RowMismatchError
from scheduler.request import EngineRequest
from scheduler.scheduler import Scheduler
from service.config.settings import all_settings, load_config
from tests.scheduler.engine_helpers import prompt, run

BLOCK_SIZE, NUM_BLOCKS, MAX_LEN = 16, 256, 2048
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
Corruption = Callable[[Scheduler], None]


def wrong_block(scheduler: Scheduler) -> None:
    """A row's block table no longer what the KV pool holds."""
    row = scheduler.running[0].row
    scheduler.rows.blocks.table[row, 0] += 1


def token_behind_the_rows_back(scheduler: Scheduler) -> None:
    """A token appended other than through PersistentBatch.append_tokens."""
    scheduler.running[0].token_ids.append(7)


class CorruptingOnce:
    """The sim backend, whose second step also corrupts the scheduler's state."""

    def __init__(self, inner: SimBackend, corrupt: Callable[[], None]) -> None:
        self.inner, self.corrupt, self.steps = inner, corrupt, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, batch: StepBatch) -> StepOutput:
        self.steps += 1
        if self.steps == 2:
            self.corrupt()
        return self.inner.execute(batch)


def sim(files: ModelFiles) -> SimBackend:
    backend = create(BackendConfig(name="sim"), files)
    backend.init_cache(NUM_BLOCKS, BLOCK_SIZE)
    return backend


def engine_corrupted_by(files: ModelFiles, corrupt: Corruption, debug_checks: bool) -> Engine:
    holder: list[Engine] = []
    backend = CorruptingOnce(sim(files), lambda: corrupt(holder[0].core.scheduler))
    engine = Engine(SchedulerConfig(debug_checks=debug_checks), PagedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE),
                    backend, files.tokenizer, max_model_len=MAX_LEN)
    holder.append(engine)
    return engine


def test_the_setting_is_off_unless_asked_for() -> None:
    setting = next(s for s in all_settings() if s.name == "debug_checks")
    assert (setting.flag, setting.env, setting.default) == ("--debug-checks", "PAGEDSERVE_DEBUG_CHECKS", False)
    assert not load_config().scheduler.debug_checks
    assert load_config(None, {"PAGEDSERVE_DEBUG_CHECKS": "true"}).scheduler.debug_checks


@pytest.mark.parametrize("corrupt", [wrong_block, token_behind_the_rows_back])
def test_a_mismatch_fails_the_engine_after_the_step(files: ModelFiles, corrupt: Corruption) -> None:
    async def body() -> None:
        engine = engine_corrupted_by(files, corrupt, debug_checks=True)
        await engine.start()
        streams = [engine.submit(EngineRequest(f"r{i}", prompt(i), GREEDY)).collect() for i in range(3)]
        failure = await asyncio.wait_for(engine.wait_failed(), 5)
        assert "engine step 2, checked with scheduler.debug_checks" in failure and "seq 0" in failure
        outs = await asyncio.gather(*streams)
        assert all(o.error for o in outs)
        await engine.stop()

    run(body)


def test_without_the_setting_the_same_mismatch_goes_unnoticed(files: ModelFiles) -> None:
    async def body() -> None:
        engine = engine_corrupted_by(files, wrong_block, debug_checks=False)
        await engine.start()
        outs = await asyncio.gather(*(engine.submit(EngineRequest(f"r{i}", prompt(i), GREEDY)).collect()
                                      for i in range(3)))
        assert all(o.error is None for o in outs) and engine.failure is None
        await engine.stop()

    run(body)


def test_the_offline_llm_checks_every_step(files: ModelFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(SchedulerConfig(debug_checks=True), PagedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE), sim(files),
              files.tokenizer, max_model_len=MAX_LEN)
    checks = 0
    check = llm.core.check_consistency

    def counted() -> None:
        nonlocal checks
        checks += 1
        check()

    monkeypatch.setattr(llm.core, "check_consistency", counted)
    llm.core.add_request(EngineRequest("r", prompt(0), GREEDY))
    assert checks == 0 and llm.run_until_idle() == checks == 6  # a prompt step, then five decode steps


def test_the_offline_llm_raises_on_a_mismatch(files: ModelFiles) -> None:
    holder: list[LLM] = []
    backend = CorruptingOnce(sim(files), lambda: token_behind_the_rows_back(holder[0].core.scheduler))
    llm = LLM(SchedulerConfig(debug_checks=True), PagedKVCacheManager(NUM_BLOCKS, BLOCK_SIZE), backend,
              files.tokenizer, max_model_len=MAX_LEN)
    holder.append(llm)
    with pytest.raises(RowMismatchError, match="seq 0: row has"):
        llm.generate([list(prompt(0))], GREEDY)
