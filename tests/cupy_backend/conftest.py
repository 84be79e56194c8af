"""Session fixtures: the emulation library built from the backend's NVRTC source, the tiny model, and the
end-to-end scenarios started in parallel child processes as soon as a test asks for one."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cuda import toolchain
from tests.cupy_backend.emu_device import start_build
from tests.cupy_backend.emu_jobs import ScenarioRunner
from tests.cupy_backend.emu_scenarios import scenarios
from tests.cupy_backend.tiny_model import write_tiny_llama_d64


@pytest.fixture(scope="session")
def emu_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gxx = toolchain.require("g++")  # CI: a failure; elsewhere: a skip with the reason
    build = start_build(gxx, tmp_path_factory.mktemp("cupy_backend_emu"))
    returncode, log = build.wait(timeout=900)
    if returncode != 0:
        pytest.fail(f"g++ emulation build of the backend's kernel source failed:\n{log}")
    if log.strip():
        warnings.warn(toolchain.BuildWarning(f"g++ emulation build (backend source):\n{log}"), stacklevel=1)
    return build.lib


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_d64(tmp_path_factory.mktemp("tiny_model") / "tiny-d64.gguf")


@pytest.fixture(scope="session")
def scenario_runner(emu_library: Path, tiny_model_path: Path) -> Iterator[ScenarioRunner]:
    runner = ScenarioRunner(emu_library, tiny_model_path, tuple(scenarios()))
    yield runner
    runner.close()
