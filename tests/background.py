"""Checks that run in child processes, started as soon as collection ends so they overlap the rest of the suite.

The CUDA emulation cases, the emulated backend's scenarios, the AArch64 kernels' emulator runs and the Phoenix
trace store's start-up are child processes that mostly wait (on g++, on the emulation's barriers, on imports),
while the rest of the suite leaves one of two cores idle for a third of its run. Their conftests
(`pytest_collection_finish`) or test module (`start_in_background`) start them through `Background` for the tests
selected, the children at a lower CPU priority (`niced`) so the foreground tests keep their cores; the tests that
read their results run last (`consumers_last`), by when the work is done. A fixture that finds no work started
(the hook found a tool missing, say) starts it itself and waits, as before.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ENV_POSITION = 10  # Popen's `env` among its positional parameters
# Fixtures whose values come from background work: the tests that use them run after all others.
CONSUMER_FIXTURES = frozenset({"case_runner", "scenario_runner", "aarch64_runs", "phoenix"})


def niced(cmd: list[str]) -> list[str]:
    """`cmd` under the idle scheduling class (chrt --idle): it runs only where no foreground thread waits for a
    core, and a waking foreground thread takes the core back at once. A nice level is not enough: the kernels'
    OpenMP threads meet at a barrier in every projection, and two busy nice-10 children slowed a decode test by
    30 % (test_native_fast, 1.51 to 1.97 s), two idle-class ones not at all. Where chrt is missing or refused, nice."""
    return [*_lower_priority(), *cmd]


@functools.cache  # looked up once: a test may patch shutil.which while background work starts children
def _lower_priority() -> tuple[str, ...]:
    chrt, nice = shutil.which("chrt"), shutil.which("nice")
    if chrt and subprocess.run([chrt, "--idle", "0", "true"], capture_output=True, check=False).returncode == 0:
        return (chrt, "--idle", "0")
    return (nice, "-n", "19") if nice else ()


def _spawn_with_own_environment() -> None:
    """Every child started from here on without an explicit `env` gets a copy of os.environ taken by its caller.
    A vfork()ed child execs from the parent's memory with the GIL let go, and without `env` it reads the process's
    environment array itself: a test that sets a variable meanwhile (monkeypatch.setenv) can free that array
    under it, and its exec fails with EFAULT ("Bad address"), as a background g++ did on CI. With `env`, the
    array the child reads is built by the caller and lives until the exec. (fork() instead of vfork() avoids the
    race too, but runs OpenBLAS's fork handler, which deadlocks while another thread is in a BLAS call.)"""
    init = subprocess.Popen.__init__
    if getattr(init, "copies_environ", False):
        return

    @functools.wraps(init)
    def with_environ(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if len(args) <= ENV_POSITION and kwargs.get("env") is None:
            kwargs["env"] = dict(os.environ)
        init(self, *args, **kwargs)

    with_environ.copies_environ = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = with_environ  # type: ignore[method-assign]


def start_selected_modules(session: pytest.Session) -> None:
    """Calls `start_in_background(session)` of each test module that defines one and has tests selected."""
    modules = {id(item.module): item.module for item in session.items if isinstance(item, pytest.Function)}
    for module in modules.values():
        start = getattr(module, "start_in_background", None)
        if start is not None:
            start(session)


def consumers_last(items: list[pytest.Item]) -> None:
    """Reorder in place: the tests that wait on background work after the rest, each group in collection order."""
    items.sort(key=lambda item: bool(CONSUMER_FIXTURES.intersection(getattr(item, "fixturenames", ()))))


class Background:
    """Work started by name in threads (each driving child processes), taken once by the fixture that needs it."""

    def __init__(self) -> None:
        _spawn_with_own_environment()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="background")
        self._started: dict[str, Future[Any]] = {}
        self._temp = tempfile.TemporaryDirectory(prefix="pagedserve-tests-")

    def directory(self, name: str) -> Path:
        """A directory for one piece of work's files, removed when the session ends."""
        path = Path(self._temp.name) / name
        path.mkdir(exist_ok=True)
        return path

    def start(self, name: str, work: Callable[..., Any], *args: Any) -> None:
        if name not in self._started:
            self._started[name] = self._pool.submit(work, *args)

    def take(self, name: str, work: Callable[..., Any], *args: Any) -> Any:
        """The value of the work started under `name`, started now if it was not; waits for it."""
        self.start(name, work, *args)
        return self._started[name].result()

    def close(self) -> None:
        """Waits for the work, then closes what it made (a runner's pool) where no fixture took it."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future in self._started.values():
            if not future.cancelled() and future.exception() is None and hasattr(future.result(), "close"):
                future.result().close()
        self._temp.cleanup()


BACKGROUND = pytest.StashKey[Background]()


def background_of(session: pytest.Session) -> Background:
    if BACKGROUND not in session.stash:
        session.stash[BACKGROUND] = Background()
    return session.stash[BACKGROUND]
