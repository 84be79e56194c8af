"""deploy/envoy.yaml as shipped: Envoy accepts it, and the settings that streaming and failover rely on."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.deploy.envoy import SHIPPED, envoy_binary, shipped_config

NEVER_RETRY = {"5xx", "gateway-error", "reset", "retriable-4xx", "envoy-ratelimited"}


def routes() -> list[dict[str, Any]]:
    listener = shipped_config()["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [r for host in manager["route_config"]["virtual_hosts"] for r in host["routes"]]


def test_envoy_accepts_the_shipped_file() -> None:
    done = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(SHIPPED), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_routes_never_cut_a_stream_nor_replay_one() -> None:
    for route in routes():
        action = route["route"]
        assert action["timeout"] == "0s"  # Envoy's default of 15 s would end longer streams
        retry_on = set(action["retry_policy"]["retry_on"].split(","))
        assert retry_on & NEVER_RETRY == set(), retry_on
        assert action["retry_policy"]["retriable_status_codes"] == [503]


def test_a_session_header_picks_the_ring_and_none_picks_least_request() -> None:
    clusters = {c["name"]: c for c in shipped_config()["static_resources"]["clusters"]}
    by_session, fallback = routes()
    assert by_session["match"]["headers"] == [{"name": "x-session-id", "present_match": True}]
    assert by_session["route"]["hash_policy"] == [{"header": {"header_name": "x-session-id"}}]
    assert clusters[by_session["route"]["cluster"]]["lb_policy"] == "RING_HASH"
    assert "headers" not in fallback["match"]
    assert clusters[fallback["route"]["cluster"]]["lb_policy"] == "LEAST_REQUEST"
    for cluster in clusters.values():
        assert [c["http_health_check"]["path"] for c in cluster["health_checks"]] == ["/health"]


def test_health_changes_reach_the_routing_at_once() -> None:
    """No merge window: a replica that failed a check or was ejected leaves rotation on the next request."""
    for cluster in shipped_config()["static_resources"]["clusters"]:
        assert cluster["common_lb_config"]["update_merge_window"] == "0s"
