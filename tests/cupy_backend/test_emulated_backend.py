"""CupyBackend's own code, with xp = numpy and the kernels' NVRTC source run by the CPU emulation, against
NumpyBackend on a tiny model: prefill, chunked prefill, a mixed prefill + decode step over shuffled block
tables, a copy-on-write fork, and greedy decode steps sampled on the "device" through both the plain and the
partitioned decode kernels; in float32, float16 and bfloat16 (see emu_scenarios.py for the tolerances); and the
same on tiny models of the other architectures (Gemma 3's sliding windows, head_dim 256, GeGLU and norms, with
and without a window pool: emu_window_scenarios.py; Qwen2, Qwen3, Llama 3's RoPE factors), graphs included."""

from __future__ import annotations

import pytest

from tests.cupy_backend.emu_jobs import ScenarioRunner
from tests.cupy_backend.emu_scenarios import scenarios


@pytest.mark.parametrize("scenario", tuple(scenarios()))
def test_backend_on_emulated_kernels_matches_numpy(scenario: str, scenario_runner: ScenarioRunner) -> None:
    outcome = scenario_runner.result(scenario)
    assert outcome.returncode == 0, outcome.explain()
