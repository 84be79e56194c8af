"""bench.step_stages: a decode step's CPU time split into the fused step's stages and the output head, on the
default model (the stages are fused_step.c's own timers; the head is timed around the forward's logits)."""

from __future__ import annotations

import pytest

from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.weights import STORED_TYPES
from bench.backend_step import BLOCK, CONTEXT
from bench.step_stages import main, stage_ms


def test_the_stages_and_the_head_fit_inside_the_step() -> None:
    backend = NumpyBackend(load_model(stored=STORED_TYPES), "native", "fast", "float32")
    backend.init_cache(2 * (CONTEXT // BLOCK + 1), BLOCK)
    ms = stage_ms(backend, 2, steps=3)
    assert set(ms) == {"step", "projections", "attention", "other", "head"}
    assert all(ms[name] > 0 for name in ("projections", "attention", "head"))
    # medians of separately timed parts: allow each its own noise, but not a part larger than the whole
    assert ms["projections"] + ms["attention"] + ms["head"] < 1.5 * ms["step"]


def test_the_command_prints_a_row_per_tier_and_batch(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--tiers", "generic", "--batches", "1,2", "--steps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert "projections" in lines[1] and "head" in lines[1]
    assert [line.split()[:2] for line in lines[2:]] == [["generic", "1"], ["generic", "2"]]
