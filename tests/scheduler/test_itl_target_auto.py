"""The ITL target in force: a configured number as given, "auto" derived once from a full decode step's predicted
cost (at least the floor), the planner holding steps to the derived target, and the engine reporting it."""

from __future__ import annotations

import pytest

from backends.step_shape import CostCoefficients, StepShape
from kvpool import PagedKVCacheManager
from scheduler.config import AUTO, SchedulerConfig
from scheduler.core import EngineCore
from scheduler.itl_target import FLOOR_MS, MULTIPLE, ROW_CONTEXT, ItlTarget, decode_step_seconds, resolve_itl_target
from scheduler.scheduler import Scheduler
from scheduler.step_cost import StepCostModel
from telemetry.interface import NullObserver
from tests.scheduler.fake_model import CharTokenizer
from tests.scheduler.helpers import EOS, make_seqs, step

# A slow host's calibration: 20 ms a step, 6 ms a decoded row (token and sampled row), KV reads and attention
# priced; a 64-row decode step is far over 100 ms.
SLOW = CostCoefficients(step=20e-3, token=5e-3, sampled=1e-3, context=10e-6, pair=2e-6)
# A GPU's: a 64-row decode step is a few ms.
FAST = CostCoefficients(step=2e-3, token=20e-6, sampled=5e-6, context=1e-8, pair=1e-10)


def slow_step_ms(rows: int, row_context: int) -> float:
    return 20 + rows * 6 + rows * row_context * 12e-3


def test_a_slow_hosts_target_is_the_multiple_of_its_full_decode_step() -> None:
    target = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, max_model_len=8192)
    step_ms = slow_step_ms(64, ROW_CONTEXT)
    assert target.decode_step_ms == pytest.approx(step_ms)
    assert target == ItlTarget(round(MULTIPLE * step_ms), True, target.decode_step_ms, 64, ROW_CONTEXT)
    assert target.ms > FLOOR_MS and target.seconds == target.ms / 1e3


def test_the_full_step_is_the_configured_batch_at_a_context_the_model_allows() -> None:
    small = resolve_itl_target(SchedulerConfig(max_num_seqs=16), SLOW, max_model_len=8192)
    short = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, max_model_len=ROW_CONTEXT // 2)
    assert small.rows == 16 and small.decode_step_ms == pytest.approx(slow_step_ms(16, ROW_CONTEXT))
    assert short.row_context == ROW_CONTEXT // 2
    assert short.decode_step_ms == pytest.approx(slow_step_ms(64, ROW_CONTEXT // 2))


def test_a_fast_host_keeps_the_floor() -> None:
    target = resolve_itl_target(SchedulerConfig(max_num_seqs=256), FAST, max_model_len=8192)
    assert target.auto and target.ms == FLOOR_MS and MULTIPLE * target.decode_step_ms < FLOOR_MS


def test_a_step_past_the_backends_large_path_counts_its_jump() -> None:
    jumpy = CostCoefficients(step=20e-3, token=2e-3, large=30e-3, large_above=32)
    assert decode_step_seconds(jumpy, 64, 512) == pytest.approx(20e-3 + 64 * 2e-3 + 30e-3)
    assert decode_step_seconds(jumpy, 32, 512) == pytest.approx(20e-3 + 32 * 2e-3)


@pytest.mark.parametrize("ms", [0.0, 50.0, 100.0, 250.0])
def test_a_configured_number_is_the_target_whatever_the_cost(ms: float) -> None:
    for coefficients in (SLOW, FAST):
        assert resolve_itl_target(SchedulerConfig(itl_target_ms=ms), coefficients, 8192) == ItlTarget(ms)


def test_auto_is_the_default() -> None:
    assert SchedulerConfig().itl_target_ms == AUTO and SchedulerConfig().targets_itl
    assert not SchedulerConfig(itl_target_ms=0).targets_itl


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "fast", "", True])
def test_bad_targets_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="itl_target_ms must be 'auto', 0 \\(off\\) or a positive number of ms"):
        SchedulerConfig(itl_target_ms=bad)  # type: ignore[arg-type]


def test_the_log_says_what_an_auto_target_came_from() -> None:
    target = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, 8192)
    text = target.describe()
    assert text.startswith(f"{target.ms:g} ms (auto: {MULTIPLE:g}x the {slow_step_ms(64, ROW_CONTEXT):.1f} ms "
                           "the step-cost model predicts")
    assert f"decode step of 64 rows of {ROW_CONTEXT} tokens" in text and f"at least {FLOOR_MS:g} ms" in text
    assert ItlTarget(0.0).describe() == "off (0)" and ItlTarget(50.0).describe() == "50 ms (as configured)"


def planner(config: SchedulerConfig) -> Scheduler:
    return Scheduler(config, PagedKVCacheManager(1024, 16), 2048, frozenset({EOS}),
                     StepCostModel(SLOW, refit_every=10**9))


def test_the_planner_holds_mixed_steps_to_the_derived_target() -> None:
    s = planner(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, min_prefill_chunk=8))
    limit = s.itl_target.seconds
    assert s.itl_target.auto and limit > FLOOR_MS / 1e3  # a target the old fixed default would not have given
    for i in range(9):
        s.add(make_seqs(i * 10, 16, max_tokens=50))
    step(s)  # the prompts; from now on they decode
    s.add(make_seqs(100, 400, max_tokens=4))
    plan = step(s)
    assert plan.decode_tokens == 9 and 8 < plan.prefill_tokens < 400  # more than the minimum, cut to fit
    assert FLOOR_MS / 1e3 < plan.predicted_s <= limit  # filled past what 100 ms allowed, within the target


@pytest.mark.parametrize("configured", [AUTO, 150.0])
def test_the_target_stays_as_derived_when_the_model_is_refitted(configured: float | str) -> None:
    s = planner(SchedulerConfig(itl_target_ms=configured))  # type: ignore[arg-type]
    assert s.cost is not None
    before = s.itl_target
    for rows in range(1, 49):  # the host became twice as slow: measured steps take twice the prediction
        shape = StepShape(rows, rows, rows * 100, rows * 100)
        s.cost.observe(shape, 2 * SLOW.seconds(shape))
    s.cost.refit()
    assert s.cost.coefficients != SLOW and s.itl_target == before  # the model moved, the target did not


class TargetReader(NullObserver):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def itl_target(self, seconds: float) -> None:
        self.seconds.append(seconds)


@pytest.mark.parametrize("configured", [AUTO, 0.0, 75.0])
def test_the_engine_reports_the_target_in_force_once(configured: float | str) -> None:
    reader = TargetReader()
    config = SchedulerConfig(itl_target_ms=configured)  # type: ignore[arg-type]
    core = EngineCore(config, PagedKVCacheManager(256, 16), CharTokenizer(), max_model_len=2048, observer=reader,
                      cost=StepCostModel(SLOW))
    assert reader.seconds == [core.scheduler.itl_target.seconds]
    expected = resolve_itl_target(config, SLOW, 2048).ms if configured == AUTO else configured
    assert core.scheduler.itl_target.ms == expected


def test_a_decode_shape_is_one_token_and_one_sampled_row_per_sequence() -> None:
    unit = CostCoefficients(token=1.0, sampled=10.0, context=100.0, pair=1000.0)
    assert decode_step_seconds(unit, 3, 7) == unit.seconds(StepShape(3, 3, 21, 21)) == 3 + 30 + 2100 + 21000
