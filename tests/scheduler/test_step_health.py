"""StepHealth on a clock the test moves: degraded while at least the failure rate of the window's steps failed
(and at least min_failures), sound again once successes or time dilute them; a running step is stalled past
both the floor and 10x its prediction."""

from __future__ import annotations

from scheduler.step_health import HealthLimits, StepHealth


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def health(**limits: float) -> tuple[StepHealth, Clock]:
    clock = Clock()
    return StepHealth(HealthLimits(**limits), clock), clock  # type: ignore[arg-type]


def test_failures_degrade_only_past_both_the_count_and_the_rate() -> None:
    steps, _ = health()
    for failed in (True, True, False, False):
        steps.outcome(failed)
    assert steps.problem() is None  # 2 failures: fewer than 3
    steps.outcome(True)
    assert steps.problem() == "3 of the 5 engine steps of the last 30 s failed"
    steps.outcome(False)
    assert steps.problem() is not None  # 3 of 6: still half
    steps.outcome(False)
    assert steps.problem() is None  # 3 of 7


def test_failures_leave_the_window_with_time() -> None:
    steps, clock = health(window_s=10.0)
    for _ in range(3):
        steps.outcome(True)
    assert steps.problem() is not None
    clock.now += 10.5
    assert steps.problem() is None


def test_a_running_step_is_stalled_past_the_floor_and_ten_times_its_prediction() -> None:
    steps, clock = health(stall_floor_s=2.0)
    steps.running(0.5)
    clock.now += 4.9
    assert steps.problem() is None  # past the floor, not past 10 x 0.5 s
    clock.now += 0.2
    assert steps.problem() == "the running engine step has taken 5.1 s (predicted 0.500 s)"
    steps.stopped()
    assert steps.problem() is None
    steps.running(0.01)
    clock.now += 2.1
    assert steps.problem() is not None  # a short prediction: the floor decides
