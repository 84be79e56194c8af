from __future__ import annotations

import time

import pytest

from backends.model.loader import ModelFiles
from backends.sim_backend import RealClock, VirtualClock, make_clock
from tests.sim_backend.helpers import backend, decode_batch, seqs, step


def test_virtual_clock_advances_by_exactly_the_modelled_time(files: ModelFiles) -> None:
    sim = backend(files, profile="h200", clock="virtual")
    assert isinstance(sim.clock, VirtualClock)
    states, total = seqs(2), 0.0
    for chunks in ([[1, 2, 3], [4, 5]], [[6], [7]], [[8], [9]]):
        before = sim.clock.now()
        out = sim.execute(step(states, chunks))
        assert sim.last_cost is not None
        assert sim.clock.now() - before == pytest.approx(sim.last_cost.seconds, rel=1e-12)
        assert out.timings == {"forward": sim.last_cost.seconds}
        total += out.timings["forward"]
    assert sim.clock.now() == pytest.approx(total)
    assert total > 3 * 1.2e-3  # three steps, each at least the per-step overhead


def test_virtual_clock_runs_instantly(files: ModelFiles) -> None:
    sim = backend(files, profile="cpu", clock="virtual")
    start = time.monotonic()
    sim.execute(decode_batch([1] * 256, [4096] * 256))
    assert sim.clock.now() > 0.5 and time.monotonic() - start < 0.5


def test_real_clock_sleeps_about_the_modelled_time(files: ModelFiles) -> None:
    sim = backend(files, profile="cpu", clock="real")
    assert isinstance(sim.clock, RealClock)
    start = time.monotonic()
    out = sim.execute(decode_batch([1], [8]))
    elapsed = time.monotonic() - start
    assert 0.015 < out.timings["forward"] < 0.03  # ~20 ms: 538 MB of fp32 weights at 28.8 GB/s, + 1 ms a step
    assert out.timings["forward"] <= elapsed < out.timings["forward"] + 0.5


def test_zero_profile_is_instant(files: ModelFiles) -> None:
    sim = backend(files, profile="zero", clock="real")
    start = time.monotonic()
    out = sim.execute(decode_batch([1] * 64, [8192] * 64))
    assert out.timings["forward"] == 0.0 and time.monotonic() - start < 0.5
    virtual = backend(files, profile="zero", clock="virtual")
    virtual.execute(decode_batch([1], [8]))
    assert virtual.clock.now() == 0.0


def test_virtual_clock_never_goes_back() -> None:
    clock = VirtualClock(start=5.0)
    clock.sleep_until(3.0)
    assert clock.now() == 5.0
    clock.sleep(0.25)
    clock.sleep(-1.0)
    assert clock.now() == 5.25


def test_make_clock() -> None:
    assert isinstance(make_clock("real"), RealClock) and isinstance(make_clock("virtual"), VirtualClock)
    with pytest.raises(ValueError, match="choose from"):
        make_clock("sundial")
