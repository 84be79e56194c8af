"""Start-up work that runs backend steps goes on a thread that ends with it (service/app/own_thread.py): a live
pool thread would keep OpenMP workers beside the step thread's and slow every later step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import service.app.server
from backends.model.loader import ModelFiles
from service.app.own_thread import run_in_own_thread
from service.app.server import build_runtime
from tests.service.live import sim_config


def test_the_work_runs_on_a_new_thread_that_ends() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 7

    assert asyncio.run(run_in_own_thread(work, "test-work")) == 7
    seen[0].join(timeout=5)
    assert seen[0].name == "test-work" and seen[0] is not threading.main_thread() and not seen[0].is_alive()


def test_its_exception_reaches_the_caller() -> None:
    def work() -> None:
        raise ValueError("calibration broke")

    with pytest.raises(ValueError, match="calibration broke"):
        asyncio.run(run_in_own_thread(work, "test-work"))


def test_a_cancelled_wait_leaves_the_work_to_finish_quietly() -> None:
    started, release = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        release.wait(5)
        return 1

    async def main() -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        task = asyncio.create_task(run_in_own_thread(work, "test-work"))
        await asyncio.to_thread(started.wait, 5)
        (thread,) = [t for t in threading.enumerate() if t.name == "test-work"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        # the thread queues its result before it ends, so the result's callback has run when join's has
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()
        return errors

    assert asyncio.run(main()) == []  # the result for the cancelled future was dropped, not set (InvalidStateError)


def test_the_server_calibrates_on_a_thread_that_ends(model_files: ModelFiles,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[threading.Thread] = []
    real = service.app.server.calibrated_cost

    def recording(*args: Any) -> Any:
        seen.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(service.app.server, "calibrated_cost", recording)
    runtime = asyncio.run(build_runtime(sim_config(), model_files))
    runtime.telemetry.shutdown()
    seen[0].join(timeout=5)
    assert seen[0].name == "pagedserve-calibrate" and not seen[0].is_alive()
