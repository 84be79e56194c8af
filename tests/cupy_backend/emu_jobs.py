"""Runs the end-to-end scenarios in child processes, a few at a time, each under a timeout: a crashing or
deadlocked emulated kernel fails its test instead of taking pytest down. The children mostly wait on the
emulation's barriers, so running them side by side finishes sooner even on two cores."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.background import niced
from tests.cuda.toolchain import REPO

# A healthy scenario takes seconds to a few tens of seconds on a busy machine; only a hang gets near this.
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Outcome:
    name: str
    returncode: int | None  # None: killed at the timeout
    output: str

    def explain(self) -> str:
        status = "timed out" if self.returncode is None else f"exit status {self.returncode}"
        return f"scenario {self.name}: {status}\n{self.output[-6000:]}"


def run_scenario(library: Path, model: Path, name: str) -> Outcome:
    cmd = niced([sys.executable, "-m", "tests.cupy_backend.emu_run", str(library), str(model), name])
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Outcome(name, None, partial + f"\nkilled after {TIMEOUT_S:.0f}s (hang?)")
    return Outcome(name, done.returncode, done.stdout + done.stderr)


class ScenarioRunner:
    """Starts every scenario at once, `workers` at a time."""

    def __init__(self, library: Path, model: Path, names: tuple[str, ...], workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: dict[str, Future[Outcome]] = {
            name: self._pool.submit(run_scenario, library, model, name) for name in names
        }

    def result(self, name: str) -> Outcome:
        return self._futures[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
