"""Session fixtures: the emulation library built from the backend's NVRTC source, the tiny model, and the
end-to-end scenarios in child processes, all begun in the background as soon as collection ends
(tests/background.py)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.background import background_of
from tests.cuda import toolchain
from tests.cupy_backend.emu_device import start_build
from tests.cupy_backend.emu_jobs import ScenarioRunner
from tests.cupy_backend.emu_scenarios import scenarios
from tests.cupy_backend.tiny_model import write_tiny_llama_d64

SCENARIOS = "emulated-backend-scenarios"
# Scenarios run side by side beside the CUDA emulation cases (tests/cuda), the rest of the suite in the
# foreground: more children than this only queue on two cores' emulated barriers.
WORKERS = 2


@dataclass(frozen=True)
class StartedScenarios:
    runner: ScenarioRunner | None  # None: the build failed
    returncode: int
    log: str  # g++'s output

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def start_scenarios(gxx: str, root: Path) -> StartedScenarios:
    """The library built, the tiny model written, then every scenario started at once."""
    build = start_build(gxx, root / "emu")
    returncode, log = build.wait(timeout=900)
    if returncode != 0:
        return StartedScenarios(None, returncode, log)
    model = write_tiny_llama_d64(root / "tiny-d64.gguf")
    return StartedScenarios(ScenarioRunner(build.lib, model, tuple(scenarios()), WORKERS), returncode, log)


def _selected(session: pytest.Session) -> bool:
    return any("scenario_runner" in getattr(item, "fixturenames", ()) for item in session.items)


def pytest_collection_finish(session: pytest.Session) -> None:
    gxx = toolchain.find("g++")
    if gxx is not None and _selected(session):
        background = background_of(session)
        background.start(SCENARIOS, start_scenarios, gxx, background.directory(SCENARIOS))


@pytest.fixture(scope="session")
def scenario_runner(request: pytest.FixtureRequest) -> ScenarioRunner:
    gxx = toolchain.require("g++")  # CI: a failure; elsewhere: a skip with the reason
    background = background_of(request.session)
    started = background.take(SCENARIOS, start_scenarios, gxx, background.directory(SCENARIOS))
    if started.returncode != 0:
        pytest.fail(f"g++ emulation build of the backend's kernel source failed:\n{started.log}")
    if started.log.strip():
        warnings.warn(toolchain.BuildWarning(f"g++ emulation build (backend source):\n{started.log}"), stacklevel=1)
    assert started.runner is not None
    return started.runner
