"""Arize Phoenix, a real trace store, as its own process: installed by `make phoenix-tools` into .venv-phoenix (its
packages stay out of .venv), serving OTLP/HTTP and its REST API on one loopback port, storing spans in SQLite
under a directory of the test session's. Started when collection ends (its start-up takes many seconds), read
back through its own REST API."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.host import free_port
from tests.background import niced

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = ROOT / ".venv-phoenix" / "bin" / "phoenix"
# Start-up is judged by the CPU time Phoenix got, not the wall clock: under the idle scheduling class it runs only
# while a core is free, which a busy stretch of the suite may not leave it for minutes.
START_CPU_S = 120.0
START_WALL_S = 900.0


@dataclass
class Phoenix:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of the project, page by page (GET /v1/projects/{project}/spans)."""
        spans: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            page = self.get(f"/v1/projects/{urllib.parse.quote(project)}/spans?{urllib.parse.urlencode(query)}")
            spans += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return spans

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as reply:
            return json.load(reply)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_phoenix(directory: Path) -> Phoenix:
    """`phoenix serve` with its SQLite under `directory`, on free ports; returns once it answers."""
    port = free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(directory), "PHOENIX_HOST": "127.0.0.1",
           "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = directory / "phoenix.log"
    with log.open("wb") as out:
        process = subprocess.Popen(niced([str(PHOENIX), "serve"]), cwd=directory, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    phoenix = Phoenix(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(phoenix)
    except BaseException:
        phoenix.close()
        raise
    return phoenix


def _wait_ready(phoenix: Phoenix) -> None:
    started = time.monotonic()
    while cpu_seconds(phoenix.process.pid) < START_CPU_S and time.monotonic() - started < START_WALL_S:
        if phoenix.process.poll() is not None:
            raise RuntimeError(f"phoenix exited with {phoenix.process.returncode}:\n{phoenix.log_tail()}")
        try:
            with urllib.request.urlopen(phoenix.url + "/healthz", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"phoenix did not answer after {cpu_seconds(phoenix.process.pid):.0f} s of CPU, "
                       f"{time.monotonic() - started:.0f} s:\n{phoenix.log_tail()}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (Linux /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
