"""The scaling experiment's pure parts: its workload and the Envoy file it runs."""

from __future__ import annotations

from itertools import islice

from bench.envoy_local import local_config
from bench.experiments.scaling import SharedSystemChat


def test_every_session_shares_the_system_prompt_and_has_its_own_turns() -> None:
    firsts = [s.first() for s in islice(SharedSystemChat(turns=3, system_len=5, user_len=4).sessions(), 3)]
    systems = {spec.messages[0] for spec in firsts}
    users = {spec.messages[1][1] for spec in firsts}
    assert len(systems) == 1 and next(iter(systems))[0] == "system" and len(users) == 3
    assert all(len(spec.messages[1][1].split()) == 4 for spec in firsts)


def test_envoy_config_points_both_clusters_at_the_replicas_on_loopback() -> None:
    config = local_config([1001, 1002])
    ports = {1001, 1002}
    for cluster in config["static_resources"]["clusters"]:
        hosts = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert {h["endpoint"]["address"]["socket_address"]["port_value"] for h in hosts} == ports
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "127.0.0.1", "port_value": 0}
    assert [c["lb_policy"] for c in config["static_resources"]["clusters"]] == ["RING_HASH", "LEAST_REQUEST"]
