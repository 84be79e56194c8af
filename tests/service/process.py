"""A real `pagedserve serve` process on an ephemeral port, for tests of signals, exit codes and logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.service.rawhttp import request


@dataclass(frozen=True)
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def serve_process(log: Path, args: Sequence[str], extra_env: Mapping[str, str] | None = None,
                  timeout: float = 30.0) -> Iterator[ServerProcess]:
    """`pagedserve serve --port 0 ARGS` with no PAGEDSERVE_* variables from the environment but `extra_env`,
    ready when yielded; killed on exit if it is still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")} | dict(extra_env or {})
    cmd = [sys.executable, "-m", "service", "serve", "--port", "0", *args]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, env=env)
    try:
        yield ServerProcess(proc, _wait_listening(proc, log, timeout), log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text())
        if found and _healthy(found.group(1)):
            return found.group(1)
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError("server did not become ready: " + log.read_text())


def _healthy(url: str) -> bool:
    try:
        return request("GET", url + "/health").status == 200
    except aiohttp.ClientError:
        return False
