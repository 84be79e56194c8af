"""Session fixtures: the emulation library builds (plain and ThreadSanitizer, built side by side, or taken from
the cache of builds from the same inputs) and a runner that starts every selected emulation case in child
processes, all begun in the background as soon as collection ends (tests/background.py)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.background import background_of
from tests.cuda import toolchain
from tests.cuda.emu_jobs import CaseRunner, Libraries

# Which sanitizer build each parametrised emulation test runs its `case` against.
SANITIZER_OF_TEST = (("test_kernel_matches_reference", ""), ("test_no_data_race", "thread"))
CASES = "cuda-emulation-cases"
BuildLog = tuple[str, int, str]  # the build's label, g++'s exit status and output


@dataclass(frozen=True)
class StartedCases:
    runner: CaseRunner | None  # None: a build failed
    logs: list[BuildLog]

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def _build_libraries(gxx: str, root: Path) -> tuple[Libraries | None, list[BuildLog]]:
    runtime = toolchain.tsan_runtime(gxx)
    kinds = ("", "thread") if runtime else ("",)
    builds = {name: toolchain.start_emu_build(gxx, root / (name or "plain"), name) for name in kinds}
    logs = [(f"g++ emulation build ({name or 'plain'})", *build.wait(timeout=900)) for name, build in builds.items()]
    if any(returncode for _, returncode, _ in logs):
        return None, logs
    tsan = builds["thread"].lib if "thread" in builds else None
    return Libraries(builds[""].lib, tsan, runtime), logs


def start_cases(gxx: str, root: Path, jobs: Sequence[tuple[str, str]]) -> StartedCases:
    """Both builds, then every selected case started in the runner's pool."""
    libs, logs = _build_libraries(gxx, root)
    if libs is None:
        return StartedCases(None, logs)
    runner = CaseRunner(libs)
    runner.prefetch(jobs)
    return StartedCases(runner, logs)


def _selected_jobs(session: pytest.Session) -> list[tuple[str, str]]:
    sanitizer_of = dict(SANITIZER_OF_TEST)
    jobs = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        name = getattr(item, "originalname", "")
        if callspec is not None and name in sanitizer_of and "case" in callspec.params:
            jobs.append((str(callspec.params["case"]), sanitizer_of[name]))
    return jobs


def pytest_collection_finish(session: pytest.Session) -> None:
    gxx, jobs = toolchain.find("g++"), _selected_jobs(session)
    if gxx is not None and jobs:
        background = background_of(session)
        background.start(CASES, start_cases, gxx, background.directory(CASES), jobs)


@pytest.fixture(scope="session")
def case_runner(request: pytest.FixtureRequest) -> CaseRunner:
    gxx = toolchain.require("g++")  # CI: a failure; elsewhere: a skip with the reason
    session = request.session
    background = background_of(session)
    started = background.take(CASES, start_cases, gxx, background.directory(CASES), _selected_jobs(session))
    for label, returncode, log in started.logs:
        if returncode != 0:
            pytest.fail(f"{label} failed:\n{log}")
        if log.strip():
            warnings.warn(toolchain.BuildWarning(f"{label}:\n{log}"), stacklevel=1)
    assert started.runner is not None
    return started.runner
