"""Session fixtures: the emulation library builds (plain and ThreadSanitizer, built side by side into a temp
dir, or taken from the cache of builds from the same inputs) and a runner that starts every selected emulation
case in parallel child processes."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cuda import toolchain
from tests.cuda.emu_jobs import CaseRunner, Libraries

# Which sanitizer build each parametrised emulation test runs its `case` against.
SANITIZER_OF_TEST = (("test_kernel_matches_reference", ""), ("test_no_data_race", "thread"))


@pytest.fixture(scope="session")
def emu_libraries(tmp_path_factory: pytest.TempPathFactory) -> Libraries:
    gxx = toolchain.require("g++")
    root = tmp_path_factory.mktemp("cuda_emu")
    runtime = toolchain.tsan_runtime(gxx)
    kinds = ("", "thread") if runtime else ("",)
    builds = {name: toolchain.start_emu_build(gxx, root / (name or "plain"), name) for name in kinds}
    libs: dict[str, Path] = {}
    for name, build in builds.items():
        returncode, log = build.wait(timeout=900)
        label = f"g++ emulation build ({name or 'plain'})"
        if returncode != 0:
            pytest.fail(f"{label} failed:\n{log}")
        if log.strip():
            warnings.warn(toolchain.BuildWarning(f"{label}:\n{log}"), stacklevel=1)
        libs[name] = build.lib
    return Libraries(libs[""], libs.get("thread"), runtime)


def _selected_jobs(session: pytest.Session) -> list[tuple[str, str]]:
    sanitizer_of = dict(SANITIZER_OF_TEST)
    jobs = []
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        name = getattr(item, "originalname", "")
        if callspec is not None and name in sanitizer_of and "case" in callspec.params:
            jobs.append((str(callspec.params["case"]), sanitizer_of[name]))
    return jobs


@pytest.fixture(scope="session")
def case_runner(request: pytest.FixtureRequest, emu_libraries: Libraries) -> Iterator[CaseRunner]:
    runner = CaseRunner(emu_libraries)
    runner.prefetch(_selected_jobs(request.session))
    yield runner
    runner.close()
