"""A `pagedserve serve` subprocess on a free loopback port, for one configuration of an experiment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

LISTENING = re.compile(r"listening on (http://\S+)")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
ENV_PREFIX = "PAGEDSERVE_"


class ServerError(RuntimeError):
    pass


class Server:
    """`with Server(["--backend", "sim", ...]) as server:` serves at `server.url` until the block ends.
    PAGEDSERVE_* variables of the caller's environment are dropped, so only `args` configure it."""

    def __init__(self, args: Sequence[str]) -> None:
        self.args = ("--host", "127.0.0.1", "--port", "0", "--log-level", "warning", "--drain-timeout-s", "1",
                     *args)
        self.url = ""
        self._log = tempfile.NamedTemporaryFile("w+", prefix="pagedserve-", suffix=".log", delete=False)
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        self._proc = subprocess.Popen([sys.executable, "-m", "service", "serve", *self.args], env=env,
                                      stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL)
        try:
            self.url = self._wait_listening()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    @property
    def pid(self) -> int:
        assert self._proc is not None, "the server is not running"
        return self._proc.pid

    def send_signal(self, sig: int) -> None:
        assert self._proc is not None, "the server is not running"
        self._proc.send_signal(sig)

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended (None while it runs)."""
        return None if self._proc is None else self._proc.poll()

    def log_text(self) -> str:
        return Path(self._log.name).read_text(errors="replace") if Path(self._log.name).exists() else ""

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ServerError(f"the server exited ({self._proc.returncode}):\n{self.log_text()[-2000:]}")
            if match := LISTENING.search(self.log_text()):
                return match.group(1)
            time.sleep(0.1)
        raise ServerError(f"the server did not start in {START_TIMEOUT_S:g} s:\n{self.log_text()[-2000:]}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise ServerError(f"the server was not ready in {START_TIMEOUT_S:g} s:\n{self.log_text()[-2000:]}")
