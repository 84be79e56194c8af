"""deploy/envoy.yaml routing 3 sim replicas: one session sticks to one replica; no session spreads the load."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.clients import body, many
from tests.deploy.envoy import Envoy
from tests.deploy.stack import Stack, stack
from tests.service.rawhttp import post

SESSIONS = 12
TURNS = 3


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack(3, Path(tmp_path_factory.mktemp("envoy"))) as up:
        yield up


def answered(up: Stack) -> list[int]:
    return [r.answered() for r in up.replicas]


def host_set_events(envoy: Envoy) -> int:
    """Changes to the affinity cluster's healthy hosts so far (a probe timing out on a loaded machine, an
    ejection), and retries (a connection refused or reset before the request reached its replica: the retry
    rightly goes to another host): each one rightly moves a turn, so a session is judged only without them."""
    cluster = "cluster.pagedserve_by_session."
    return sum(envoy.stat(cluster + name) for name in
               ("membership_change", "health_check.failure", "outlier_detection.ejections_enforced_total",
                "upstream_rq_retry"))


def session_owner(up: Stack, session: int) -> tuple[list[int], bool]:
    """Replies per replica to one session's turns, and whether the host set stayed the same meanwhile: no event
    counted, and the same hosts routed to at the end as at the start (a host coming back moves turns too, and
    nothing counts it: an ejection ending after its 10 s, a host passing its health check again)."""
    events, hosts, before = host_set_events(up.envoy), up.routed_to(), answered(up)
    for turn in range(TURNS):
        reply = post(up.envoy.url + "/v1/completions", body(1, False, f"turn {turn}"),
                     {"X-Session-Id": f"session-{session}"})
        assert reply.status == 200, reply.body
    gained = [after - b for after, b in zip(answered(up), before, strict=True)]
    return gained, host_set_events(up.envoy) == events and up.routed_to() == hosts


def judged_session(up: Stack, session: int) -> list[int]:
    """One session's replies per replica, from its first run across a stable host set."""
    for _ in range(3):
        gained, stable = session_owner(up, session)
        if stable:
            return gained
    raise AssertionError(f"session {session}: the healthy hosts kept changing; the session could not be judged")


def test_requests_of_one_session_land_on_one_replica(three: Stack) -> None:
    """Every session's turns on one replica. A session split across replicas is run once more and must not split
    again, and at most one session may split once (it is reported as a warning): in four loaded CI runs so far,
    one session of the run split across a stable host set with none of Envoy's counted events, cause unknown.
    Routing that ignored the session would split about 8 sessions in 9, and the same session again 8 times in
    9."""
    owners, splits = [], []
    for session in range(SESSIONS):
        gained = judged_session(three, session)
        if sorted(gained) != [0, 0, TURNS]:
            splits.append((session, gained, sorted(three.routed_to())))
            gained = judged_session(three, session)
        assert sorted(gained) == [0, 0, TURNS], (session, gained, splits)
        owners.append(gained.index(TURNS))
    assert len(set(owners)) > 1, "every session hashed to one replica"
    assert len(splits) <= 1, splits
    if splits:
        warnings.warn(f"a session split once and not again (session, replies per replica, hosts): {splits}",
                      stacklevel=1)


def test_requests_without_a_session_spread_within_20_percent(three: Stack) -> None:
    """60 streams arriving over about 1.5 s, each about 3 s long: least-request gives each replica a third of
    them, within 20 %. (A burst all at once would not spread: Envoy counts a request against a replica once it
    has a connection to it, so a burst sees every replica idle and picks at random.)"""
    before = answered(three)
    outcomes = asyncio.run(many(three.envoy.url, 60, tokens=100, stream=True, every_s=0.025))
    assert all(o.complete_stream for o in outcomes), [o for o in outcomes if not o.complete_stream][:1]
    gained = [after - b for after, b in zip(answered(three), before, strict=True)]
    assert sum(gained) == 60
    assert all(16 <= g <= 24 for g in gained), gained
