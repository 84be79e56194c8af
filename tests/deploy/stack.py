"""Replicas behind Envoy on loopback, ready when yielded: every replica healthy in both of Envoy's clusters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.envoy import Envoy, local_config, run_envoy, shipped_config
from tests.deploy.fleet import Replica, replicas
from tests.waiting import wait_until

CLUSTERS = tuple(c["name"] for c in shipped_config()["static_resources"]["clusters"])


@dataclass(frozen=True)
class Stack:
    replicas: list[Replica]
    envoy: Envoy

    def routed_to(self) -> set[str]:
        """The replicas (host:port) that Envoy routes new requests to, in every cluster."""
        return set.intersection(*(self.envoy.healthy_hosts(c) for c in CLUSTERS))


@contextmanager
def stack(count: int, workdir: Path) -> Iterator[Stack]:
    with replicas(count, workdir) as fleet, run_envoy(local_config([r.port for r in fleet]), workdir) as envoy:
        up = Stack(fleet, envoy)
        wait_until(lambda: up.routed_to() == {r.host for r in fleet}, timeout=20.0,
                   what="every replica healthy in Envoy")
        yield up
