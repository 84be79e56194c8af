"""The kernels' exact source, built with g++ against tests/cuda_emu/cuda_emu.h and run on the CPU, matches the
NumPy references; the ThreadSanitizer build of the same library reports no race. Each case runs in a child
process with a timeout (see emu_jobs.py)."""

from __future__ import annotations

import pytest

from tests.cuda import toolchain
from tests.cuda.emu_cases import plain_cases, tsan_cases
from tests.cuda.emu_jobs import TSAN_EXIT_CODE, CaseRunner, Outcome


def _explain(outcome: Outcome) -> str:
    status = "timed out" if outcome.returncode is None else f"exit status {outcome.returncode}"
    return f"case {outcome.case}: {status}\n{outcome.output[-6000:]}"


@pytest.mark.parametrize("case", plain_cases())
def test_kernel_matches_reference(case: str, case_runner: CaseRunner) -> None:
    outcome = case_runner.result(case, "")
    assert outcome.returncode == 0, _explain(outcome)


def _require_tsan(runner: CaseRunner) -> None:
    if runner.libs.tsan is None:
        toolchain.unavailable("g++ has no ThreadSanitizer runtime (libtsan)")


@pytest.mark.parametrize("case", tsan_cases())
def test_no_data_race(case: str, case_runner: CaseRunner) -> None:
    _require_tsan(case_runner)
    outcome = case_runner.result(case, "thread")
    assert outcome.returncode == 0 and not outcome.race_reported, _explain(outcome)


def test_thread_sanitizer_sees_emulated_threads(case_runner: CaseRunner) -> None:
    """Control for test_no_data_race: an unsynchronised shared-memory handoff must be reported."""
    _require_tsan(case_runner)
    outcome = case_runner.result("probe-race", "thread")
    assert outcome.returncode == TSAN_EXIT_CODE and "data race" in outcome.output, _explain(outcome)
