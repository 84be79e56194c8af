"""Servers on the sim backend with injected faults (backends/sim_backend/faults.py), and what their tests ask
of them: a completion, the step-failure counts of /metrics."""

from __future__ import annotations

import re
from typing import Any

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config.settings import AppConfig, ServiceConfig
from tests.service.live import LiveServer, cached_builder
from tests.service.rawhttp import Reply, post, request
from tests.waiting import wait_until

CMPL = "/v1/completions"


def fault_server(files: ModelFiles, faults: str, step_timeout_s: float = 30.0, profile: str = "zero",
                 scheduler: SchedulerConfig | None = None, **service: Any) -> LiveServer:
    config = AppConfig(ServiceConfig(port=0, step_timeout_s=step_timeout_s, **service),
                       BackendConfig(name="sim", sim_profile=profile, sim_faults=faults),
                       scheduler or SchedulerConfig(), KVPoolConfig(num_blocks=256))
    return LiveServer.start(config, cached_builder(files))


def completion(server: LiveServer, max_tokens: int = 2, stream: bool = False) -> Reply:
    return post(server.url + CMPL, {"prompt": "Hello there", "max_tokens": max_tokens, "stream": stream})


def step_failures(server: LiveServer, cause: str) -> float:
    body = request("GET", server.url + "/metrics").body.decode()
    found = re.search(rf'pagedserve:engine_step_failures_total{{cause="{cause}"}} (\S+)', body)
    return float(found.group(1)) if found else -1.0


def wait_for_count(server: LiveServer, cause: str, expected: float) -> None:
    wait_until(lambda: step_failures(server, cause) == expected, what=f"{cause} failures == {expected}")
