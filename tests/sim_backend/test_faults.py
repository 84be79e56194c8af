"""The sim backend's fault injection: the spec's grammar, and each kind on the step it names."""

from __future__ import annotations

import re
import threading
import time

import pytest

from backends.base import BackendError
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from backends.sim_backend.faults import Fault, FaultSpecError, InjectedFault, parse_faults
from tests.sim_backend.helpers import decode_batch


def sim(files: ModelFiles, faults: str, seed: int = 0) -> SimBackend:
    return create(BackendConfig(name="sim", sim_clock="virtual", sim_faults=faults, sim_seed=seed), files)


def test_spec_grammar() -> None:
    assert parse_faults(" step_error@3, bad_token%5 ,slow_step:0.25@2,hang@9,hang:3%1.5,") == (
        Fault("step_error", step=3), Fault("bad_token", percent=5.0), Fault("slow_step", step=2, seconds=0.25),
        Fault("hang", step=9), Fault("hang", percent=1.5, seconds=3.0))
    assert parse_faults("") == ()


@pytest.mark.parametrize("spec", ["boom@1", "step_error", "slow_step@1", "step_error:1@2", "bad_token:2%5",
                                  "hang@0", "bad_token%0", "bad_token%101", "slow_step:1.2.3@1", "step_error@x"])
def test_bad_specs_name_the_item(spec: str) -> None:
    with pytest.raises(FaultSpecError, match=re.escape(repr(spec))):
        parse_faults(spec)
    with pytest.raises(ValueError):  # at config time: the server refuses to start
        BackendConfig(name="sim", sim_faults=spec)


def test_a_config_that_skipped_validation_is_still_a_backend_error(files: ModelFiles) -> None:
    config = BackendConfig(name="sim")
    object.__setattr__(config, "sim_faults", "nonsense")
    with pytest.raises(BackendError, match="nonsense"):
        create(config, files)


def test_step_error_fires_on_its_step_only(files: ModelFiles) -> None:
    backend, batch = sim(files, "step_error@2"), decode_batch([10, 11], [5, 6])
    backend.execute(batch)
    with pytest.raises(InjectedFault, match="step 2"):
        backend.execute(batch)
    assert backend.execute(batch).token_ids.shape == (2,)


def test_bad_token_puts_one_row_outside_the_vocabulary(files: ModelFiles) -> None:
    clean, faulty = sim(files, ""), sim(files, "bad_token@1")
    batch = decode_batch([10, 11, 12, 13], [5, 6, 7, 8])
    good, bad = clean.execute(batch).token_ids, faulty.execute(batch).token_ids
    outside = [i for i, t in enumerate(bad.tolist()) if t >= files.config.vocab_size]
    assert len(outside) == 1 and [t for i, t in enumerate(bad.tolist()) if i not in outside] == [
        t for i, t in enumerate(good.tolist()) if i not in outside]


def test_percent_faults_are_seeded(files: ModelFiles) -> None:
    def failing_steps(seed: int) -> list[int]:
        backend, batch, fired = sim(files, "step_error%30", seed), decode_batch([10], [5]), []
        for step in range(1, 41):
            try:
                backend.execute(batch)
            except InjectedFault:
                fired.append(step)
        return fired

    assert failing_steps(1) == failing_steps(1) and 4 <= len(failing_steps(1)) <= 20
    assert failing_steps(1) != failing_steps(2)


def test_slow_step_costs_time_on_the_backends_clock(files: ModelFiles) -> None:
    backend, batch = sim(files, "slow_step:2.5@1"), decode_batch([10], [5])
    before = backend.clock.now()
    backend.execute(batch)
    # virtual: no real wait; the step itself costs nothing on the default "zero" profile, so exactly 2.5 (measured)
    assert backend.clock.now() - before == pytest.approx(2.5)


def test_hang_blocks_until_released_and_faulty_backends_are_never_instant(files: ModelFiles) -> None:
    backend, batch = sim(files, "hang@1"), decode_batch([10], [5])
    assert not backend.step_is_instant and sim(files, "").step_is_instant
    done = threading.Event()
    worker = threading.Thread(target=lambda: (backend.execute(batch), done.set()), daemon=True)
    worker.start()
    assert not done.wait(0.3)
    backend.faults.release()
    assert done.wait(5)


def test_bounded_hang(files: ModelFiles) -> None:
    backend, batch = sim(files, "hang:0.2@1"), decode_batch([10], [5])
    start = time.monotonic()
    backend.execute(batch)
    assert 0.2 <= time.monotonic() - start < 2.0
