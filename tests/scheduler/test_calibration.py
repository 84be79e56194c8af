"""Warm-up calibration of the step-cost model: it fits the model on real steps and leaves the KV pool as it
found it, also when it fails; a server whose calibration fails serves on the backend's guess."""

from __future__ import annotations

import logging

import pytest

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from backends.sim_backend.faults import InjectedFault
from kvpool import PagedKVCacheManager
from scheduler.calibration import calibrate
from scheduler.config import SchedulerConfig
from scheduler.step_cost import StepCostModel

BLOCK = 16


def sim(files: ModelFiles, num_blocks: int, faults: str = "") -> tuple[SimBackend, PagedKVCacheManager]:
    backend = create(BackendConfig(name="sim", sim_profile="cpu", sim_clock="virtual", sim_faults=faults), files)
    assert isinstance(backend, SimBackend)
    backend.init_cache(num_blocks, BLOCK)
    return backend, PagedKVCacheManager(num_blocks, BLOCK)


def test_calibration_fits_the_model_on_measured_steps_and_gives_every_block_back(files: ModelFiles) -> None:
    backend, kv = sim(files, 256)
    cost = StepCostModel(backend.cost_prior())
    done = calibrate(SchedulerConfig(), kv, backend, files.tokenizer, 2048, cost)
    assert done.steps >= 12 and done.seconds > 0
    assert cost.coefficients != cost.prior  # the sum-of-roofline guess was corrected
    stats = kv.stats()
    assert stats.used_blocks == 0 and stats.cached_free_blocks == 0
    kv.check_invariants()


def test_calibration_steps_mix_prefill_into_decoding(files: ModelFiles) -> None:
    backend, kv = sim(files, 256)
    shapes = []
    execute = backend.execute

    def recording(batch):  # type: ignore[no-untyped-def]
        shapes.append((batch.num_tokens, int(batch.sample_rows.shape[0])))
        return execute(batch)

    backend.execute = recording  # type: ignore[method-assign]
    calibrate(SchedulerConfig(), kv, backend, files.tokenizer, 2048, StepCostModel(backend.cost_prior()))
    decode_only = [t for t, s in shapes if t == s]
    assert {1, 8} <= set(decode_only)  # one row, and a batch of rows
    assert any(t > s + 32 and s >= 8 for t, s in shapes)  # a prompt chunk beside eight decoding rows


def test_a_small_pool_gets_a_calibration_that_fits_it(files: ModelFiles) -> None:
    backend, kv = sim(files, 12)  # 192 tokens for one sequence
    assert calibrate(SchedulerConfig(), kv, backend, files.tokenizer, 2048,
                     StepCostModel(backend.cost_prior())).steps >= 12
    assert kv.stats().used_blocks == 0


def test_a_failed_calibration_gives_every_block_back(files: ModelFiles) -> None:
    backend, kv = sim(files, 256, faults="step_error@6")  # the backend fails mid-calibration
    with pytest.raises(InjectedFault):
        calibrate(SchedulerConfig(), kv, backend, files.tokenizer, 2048, StepCostModel(backend.cost_prior()))
    assert kv.stats().used_blocks == 0
    kv.check_invariants()


def test_a_server_whose_calibration_fails_serves_on_the_guess(files: ModelFiles,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from service.app.assemble import ModelParts, calibrated_cost  # noqa: PLC0415
    from service.config.settings import AppConfig  # noqa: PLC0415

    backend, kv = sim(files, 256, faults="step_error@6")
    config = AppConfig(scheduler=SchedulerConfig(itl_target_ms=100))
    with caplog.at_level(logging.WARNING):
        cost = calibrated_cost(config, ModelParts(files, backend, kv, 2048))
    assert cost.coefficients == cost.prior == backend.cost_prior()
    assert "step-cost calibration failed" in caplog.text
    assert kv.stats().used_blocks == 0


def test_no_calibration_without_a_target(files: ModelFiles) -> None:
    from service.app.assemble import ModelParts, calibrated_cost  # noqa: PLC0415
    from service.config.settings import AppConfig  # noqa: PLC0415

    backend, kv = sim(files, 256)
    cost = calibrated_cost(AppConfig(scheduler=SchedulerConfig(itl_target_ms=0)), ModelParts(files, backend, kv, 2048))
    assert cost.observed == 0
