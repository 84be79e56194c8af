"""Runs emulation cases in child processes, several at a time, each under a timeout.

A child per case keeps a crashing or deadlocked kernel from taking pytest down. Emulated kernels spend most
of their time waiting on barriers (thread wake-ups), not computing, so a few children in parallel finish far
sooner than one after another even on two cores.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.background import niced
from tests.cuda.toolchain import REPO

# halt_on_error: the first report ends the child with TSAN_EXIT_CODE.
TSAN_EXIT_CODE = 66
TSAN_OPTIONS = f"halt_on_error=1 exitcode={TSAN_EXIT_CODE} second_deadlock_stack=1"


def case_timeout_s(sanitizer: str) -> float:
    """Generous: a healthy case takes seconds; only a hung kernel gets near this."""
    return 300.0 if sanitizer == "thread" else 120.0


@dataclass(frozen=True)
class Outcome:
    case: str
    returncode: int | None  # None: killed at the timeout
    output: str

    @property
    def race_reported(self) -> bool:
        return "ThreadSanitizer" in self.output


@dataclass(frozen=True)
class Libraries:
    plain: Path
    tsan: Path | None  # None where g++ has no ThreadSanitizer runtime
    tsan_runtime: str | None  # libtsan to preload into the child Python

    def lib(self, sanitizer: str) -> Path:
        lib = self.tsan if sanitizer == "thread" else self.plain
        if lib is None:
            raise RuntimeError("no ThreadSanitizer build")
        return lib


def _command(libs: Libraries, case: str, sanitizer: str, no_aslr: bool) -> tuple[list[str], dict[str, str]]:
    cmd = [sys.executable, "-m", "tests.cuda.emu_runner", str(libs.lib(sanitizer)), case]
    env = dict(os.environ)
    if sanitizer == "thread":
        if libs.tsan_runtime is None:
            raise RuntimeError("no ThreadSanitizer runtime (libtsan.so) next to g++")
        env["LD_PRELOAD"] = libs.tsan_runtime
        env["TSAN_OPTIONS"] = TSAN_OPTIONS
        setarch = shutil.which("setarch")
        if no_aslr and setarch:
            cmd = [setarch, platform.machine(), "-R", *cmd]
    return niced(cmd), env


def run_case(libs: Libraries, case: str, sanitizer: str) -> Outcome:
    """One case in a child process. Older ThreadSanitizer runtimes cannot map their shadow memory under high
    ASLR entropy ('unexpected memory mapping'); then the child is retried with ASLR off (setarch -R)."""
    outcome = _run(libs, case, sanitizer, no_aslr=False)
    if sanitizer == "thread" and "unexpected memory mapping" in outcome.output:
        outcome = _run(libs, case, sanitizer, no_aslr=True)
    return outcome


def _run(libs: Libraries, case: str, sanitizer: str, no_aslr: bool) -> Outcome:
    cmd, env = _command(libs, case, sanitizer, no_aslr)
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=case_timeout_s(sanitizer),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Outcome(case, None, partial + f"\nkilled after {case_timeout_s(sanitizer):.0f}s (hang?)")
    return Outcome(case, done.returncode, done.stdout + done.stderr)


class CaseRunner:
    """Starts cases in a small pool as soon as they are known; `result` waits for one."""

    def __init__(self, libs: Libraries, workers: int = 4) -> None:
        self.libs = libs
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: dict[tuple[str, str], Future[Outcome]] = {}

    def prefetch(self, jobs: Iterable[tuple[str, str]]) -> None:
        for case, sanitizer in jobs:
            if sanitizer == "thread" and self.libs.tsan is None:
                continue  # the test skips or fails on its own
            if (case, sanitizer) not in self._futures:
                self._futures[case, sanitizer] = self._pool.submit(run_case, self.libs, case, sanitizer)

    def result(self, case: str, sanitizer: str) -> Outcome:
        self.prefetch([(case, sanitizer)])
        return self._futures[case, sanitizer].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
