"""Sim-backend `pagedserve serve` replicas on loopback ports, started together, and what each one answered
(its /metrics request counters: the server adds no header naming itself)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from tests.service.rawhttp import request

# cpu: real-clock steps of about 25 ms, so a stream of N tokens stays in flight for about N/40 s.
REPLICA_ARGS = ("--host", "127.0.0.1", "--backend", "sim", "--sim-profile", "cpu", "--log-level", "info")
COMPLETIONS = 'pagedserve:http_requests_total{method="POST",route="/v1/completions",status="%d"}'


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metric(self, series: str) -> float:
        """One series' value from /metrics; 0 when the series is absent (nothing counted yet)."""
        text = request("GET", self.url + "/metrics").body.decode()
        found = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def answered(self, status: int = 200) -> int:
        return int(self.metric(COMPLETIONS % status))

    def running(self) -> int:
        return int(self.metric("pagedserve:num_requests_running"))

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


@contextmanager
def replicas(count: int, workdir: Path, extra: Sequence[str] = (), timeout: float = 60.0) -> Iterator[list[Replica]]:
    """`count` replicas, ready (/health 200) when yielded; killed on exit if still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
    fleet = [_spawn(workdir / f"replica-{i}.log", [*REPLICA_ARGS, *extra], env) for i in range(count)]
    try:
        deadline = time.monotonic() + timeout
        for replica in fleet:
            replica.url = _wait_ready(replica, deadline)
        yield fleet
    finally:
        for replica in fleet:
            if replica.proc.poll() is None:
                replica.proc.kill()
                replica.proc.wait()


def _spawn(log: Path, args: Sequence[str], env: dict[str, str]) -> Replica:
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "service", "serve", "--port", "0", *args],
                                stdout=subprocess.DEVNULL, stderr=sink, env=env)
    return Replica(proc, log)


def _wait_ready(replica: Replica, deadline: float) -> str:
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", replica.log.read_text())
        if found and _ready(found.group(1)):
            return found.group(1)
        assert replica.proc.poll() is None, replica.log.read_text()
        time.sleep(0.05)
    raise AssertionError("replica did not become ready: " + replica.log.read_text())


def _ready(url: str) -> bool:
    try:
        return request("GET", url + "/health").status == 200
    except (OSError, aiohttp.ClientError):
        return False


@contextmanager
def restarted(replica: Replica, log: Path, timeout: float = 60.0) -> Iterator[Replica]:
    """A new replica on a stopped one's address (as a rolling restart brings it back), ready when yielded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
    again = _spawn(log, [*REPLICA_ARGS, "--port", str(replica.port)], env)
    try:
        again.url = _wait_ready(again, time.monotonic() + timeout)
        yield again
    finally:
        if again.proc.poll() is None:
            again.proc.kill()
            again.proc.wait()
