"""The ITL target in force: a configured number as given; "auto" a multiple of each step's decode part (at least
the floor), stretched while more prompts wait than sequences decode; the planner holding steps to it, and the
engine reporting the limit in force."""

from __future__ import annotations

import pytest

from backends.model.loader import ModelFiles, open_model
from backends.step_shape import CostCoefficients, StepShape
from bench.closed_loop_sim import Load, simulate
from kvpool import PagedKVCacheManager
from scheduler.config import AUTO, SchedulerConfig
from scheduler.core import EngineCore
from scheduler.itl_target import (
    DECODE_MULTIPLE,
    FLOOR_MS,
    ROW_CONTEXT,
    ItlTarget,
    decode_step_seconds,
    resolve_itl_target,
)
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.scheduler import Scheduler
from scheduler.step_cost import StepCostModel
from telemetry.interface import NullObserver
from tests.scheduler.fake_model import CharTokenizer, PositionBackend, run_step
from tests.scheduler.helpers import EOS, make_seqs, step

# A slow host's calibration: 20 ms a step, 6 ms a decoded row (token and sampled row), KV reads and attention
# priced; a 64-row decode step is far over 100 ms.
SLOW = CostCoefficients(step=20e-3, token=5e-3, sampled=1e-3, context=10e-6, pair=2e-6)
# A GPU's: a 64-row decode step is a few ms.
FAST = CostCoefficients(step=2e-3, token=20e-6, sampled=5e-6, context=1e-8, pair=1e-10)


def slow_step_ms(rows: int, row_context: int) -> float:
    return 20 + rows * 6 + rows * row_context * 12e-3


def test_auto_is_the_floor_and_a_multiple_of_the_steps_decode_part() -> None:
    target = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, max_model_len=8192)
    assert target == ItlTarget(FLOOR_MS, True, target.decode_step_ms, 64, ROW_CONTEXT)
    assert target.decode_step_ms == pytest.approx(slow_step_ms(64, ROW_CONTEXT))  # for the log
    assert target.limit_seconds(0.030, decoding=4, prefilling=0) == FLOOR_MS / 1e3  # 2 x 30 ms: under the floor
    assert target.limit_seconds(0.080, decoding=4, prefilling=0) == pytest.approx(DECODE_MULTIPLE * 0.080)


def test_auto_stretches_by_the_prompts_waiting_per_sequence_decoding() -> None:
    target = resolve_itl_target(SchedulerConfig(), SLOW, max_model_len=8192)
    assert target.limit_seconds(0.080, decoding=1, prefilling=15) == pytest.approx(16 * DECODE_MULTIPLE * 0.080)
    assert target.limit_seconds(0.080, decoding=15, prefilling=1) == pytest.approx(16 / 15 * DECODE_MULTIPLE * 0.080)
    # a short decode part (a GPU's): the floor, stretched only while prompts outnumber the streams
    assert target.limit_seconds(0.020, decoding=2, prefilling=6) == pytest.approx(3 * FLOOR_MS / 1e3)
    assert target.limit_seconds(0.020, decoding=8, prefilling=4) == FLOOR_MS / 1e3


def test_the_full_step_for_the_log_is_the_configured_batch_at_a_context_the_model_allows() -> None:
    small = resolve_itl_target(SchedulerConfig(max_num_seqs=16), SLOW, max_model_len=8192)
    short = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, max_model_len=ROW_CONTEXT // 2)
    assert small.rows == 16 and small.decode_step_ms == pytest.approx(slow_step_ms(16, ROW_CONTEXT))
    assert short.row_context == ROW_CONTEXT // 2
    assert short.decode_step_ms == pytest.approx(slow_step_ms(64, ROW_CONTEXT // 2))


def test_a_step_past_the_backends_large_path_counts_its_jump() -> None:
    jumpy = CostCoefficients(step=20e-3, token=2e-3, large=30e-3, large_above=32)
    assert decode_step_seconds(jumpy, 64, 512) == pytest.approx(20e-3 + 64 * 2e-3 + 30e-3)
    assert decode_step_seconds(jumpy, 32, 512) == pytest.approx(20e-3 + 32 * 2e-3)


@pytest.mark.parametrize("ms", [0.0, 50.0, 100.0, 250.0])
def test_a_configured_number_is_the_target_whatever_the_cost(ms: float) -> None:
    for coefficients in (SLOW, FAST):
        target = resolve_itl_target(SchedulerConfig(itl_target_ms=ms), coefficients, 8192)
        assert target == ItlTarget(ms) and target.limit_seconds(5.0, decoding=1, prefilling=50) == ms / 1e3


def test_auto_is_the_default() -> None:
    assert SchedulerConfig().itl_target_ms == AUTO and SchedulerConfig().targets_itl
    assert not SchedulerConfig(itl_target_ms=0).targets_itl


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "fast", "", True])
def test_bad_targets_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="itl_target_ms must be 'auto', 0 \\(off\\) or a positive number of ms"):
        SchedulerConfig(itl_target_ms=bad)  # type: ignore[arg-type]


def test_the_log_says_what_an_auto_target_came_from() -> None:
    target = resolve_itl_target(SchedulerConfig(max_num_seqs=64), SLOW, 8192)
    full = slow_step_ms(64, ROW_CONTEXT)
    assert target.describe() == (
        f"auto: a step that prefills beside decoding sequences may take {DECODE_MULTIPLE:g}x its decode part's "
        f"predicted time times (prompts waiting + sequences decoding) / sequences decoding, at least {FLOOR_MS:g} "
        f"ms times prompts waiting / sequences decoding where that is over 1 ({DECODE_MULTIPLE * full:.0f} ms "
        f"before those factors with 64 rows of {ROW_CONTEXT} tokens decoding, whose step the start-up calibration "
        f"predicts at {full:.1f} ms)")
    assert ItlTarget(0.0).describe() == "off (0)" and ItlTarget(50.0).describe() == "50 ms (as configured)"


def planner(config: SchedulerConfig) -> Scheduler:
    return Scheduler(config, PagedKVCacheManager(1024, 16), 2048, frozenset({EOS}),
                     StepCostModel(SLOW, refit_every=10**9))


def decoding_nine(s: Scheduler) -> None:
    for i in range(9):
        s.add(make_seqs(i * 10, 16, max_tokens=50))
    step(s)  # the prompts; from now on they decode


def test_the_planner_holds_mixed_steps_to_the_limit() -> None:
    s = planner(SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512, min_prefill_chunk=8))
    decoding_nine(s)
    s.add(make_seqs(100, 400, max_tokens=4))
    plan = step(s)
    decode = SLOW.seconds(StepShape(9, 9, 9 * 17, 9 * 17))  # each row's 16 prompt tokens and its first token
    assert plan.decode_tokens == 9 and 8 < plan.prefill_tokens < 400  # more than the minimum, cut to fit
    limit = DECODE_MULTIPLE * decode * (1 + 1 / 9)  # one prompt waits beside nine streams
    assert FLOOR_MS / 1e3 < plan.predicted_s <= limit and s.itl_limit_s == pytest.approx(limit)


def test_a_burst_of_prompts_gets_longer_steps_than_a_single_newcomer() -> None:
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, min_prefill_chunk=8)
    one, burst = planner(config), planner(config)
    for s, newcomers in ((one, 1), (burst, 27)):
        decoding_nine(s)
        for i in range(newcomers):
            s.add(make_seqs(200 + i * 10, 400, max_tokens=4))
    alone, crowded = step(one), step(burst)
    assert burst.itl_limit_s == pytest.approx((1 + 27 / 9) / (1 + 1 / 9) * one.itl_limit_s)  # over the floor
    assert crowded.prefill_tokens > 2 * alone.prefill_tokens and crowded.predicted_s <= burst.itl_limit_s


def limit_after_a_step(s: Scheduler) -> float:
    step(s)
    return s.itl_limit_s


def test_auto_follows_the_refitted_model_and_a_number_stays() -> None:
    auto, fixed = (planner(SchedulerConfig(itl_target_ms=t)) for t in (AUTO, 150.0))
    for s in (auto, fixed):
        decoding_nine(s)
        s.add(make_seqs(100, 400, max_tokens=4))
    before = [limit_after_a_step(s) for s in (auto, fixed)]
    for s in (auto, fixed):
        assert s.cost is not None
        for rows in range(1, 49):  # the host became twice as slow: measured steps take twice the prediction
            shape = StepShape(rows, rows, rows * 100, rows * 100)
            s.cost.observe(shape, 2 * SLOW.seconds(shape))
        s.cost.refit()
    after = [limit_after_a_step(s) for s in (auto, fixed)]
    assert after[0] > 1.5 * before[0] and after[1] == before[1] == 0.150


class TargetReader(NullObserver):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def itl_target(self, seconds: float) -> None:
        self.seconds.append(seconds)


@pytest.mark.parametrize("configured", [AUTO, 0.0, 75.0])
def test_the_engine_reports_the_limit_in_force(configured: float | str) -> None:
    reader = TargetReader()
    config = SchedulerConfig(itl_target_ms=configured, max_num_batched_tokens=64)  # type: ignore[arg-type]
    core = EngineCore(config, PagedKVCacheManager(256, 16), CharTokenizer(), max_model_len=2048, observer=reader,
                      cost=StepCostModel(SLOW, refit_every=10**9))
    assert reader.seconds == [FLOOR_MS / 1e3 if configured == AUTO else float(configured) / 1e3]
    backend = PositionBackend()
    core.add_request(EngineRequest("a", (5,) * 8, SamplingParams(max_tokens=20, ignore_eos=True)))
    assert run_step(core, backend)  # the first prompt: it decodes from now on
    for rid in "bcd":
        core.add_request(EngineRequest(rid, (6,) * 200, SamplingParams(max_tokens=2, ignore_eos=True)))
    assert run_step(core, backend)  # a step that prefills beside a decode, three prompts waiting
    if configured == AUTO:  # 2x a decoding row is under the floor, stretched 3x: 3 prompts wait, 1 decodes
        assert reader.seconds == [0.1, pytest.approx(0.3)] and core.scheduler.itl_limit_s == pytest.approx(0.3)
    else:
        assert reader.seconds == [float(configured) / 1e3]


def test_a_decode_shape_is_one_token_and_one_sampled_row_per_sequence() -> None:
    unit = CostCoefficients(token=1.0, sampled=10.0, context=100.0, pair=1000.0)
    assert decode_step_seconds(unit, 3, 7) == unit.seconds(StepShape(3, 3, 21, 21)) == 3 + 30 + 2100 + 21000


@pytest.fixture(scope="module")
def files() -> ModelFiles:
    return open_model(None)[1]


def test_a_gpu_under_auto_serves_as_at_100_ms(files: ModelFiles) -> None:
    """On the sim H100 (Llama-3-8B, throughput preset, 64 closed-loop clients of 1024-token prompts; virtual clock,
    so exact) a decode part is a few ms: auto's limit is the floor, and only the first burst's stretch differs."""
    load, budget = Load(64, 1024, 128, 192), {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    auto, fixed = (simulate(files, "h100", SchedulerConfig(**budget, itl_target_ms=t), load,  # type: ignore[arg-type]
                            "llama-3-8b") for t in (AUTO, 100.0))
    assert auto.p("itl", 99) <= FLOOR_MS / 1e3 and fixed.p("itl", 99) <= FLOOR_MS / 1e3
    assert abs(auto.throughput / fixed.throughput - 1) < 0.02 and auto.p("ttft", 99) < 1.1 * fixed.p("ttft", 99)
