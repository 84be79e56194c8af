"""deploy/envoy.yaml when a replica goes away: SIGTERM (drain) loses no request; SIGKILL loses only that
replica's own streams in flight."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.deploy.clients import Outcome, complete, many
from tests.deploy.fleet import Replica, restarted
from tests.deploy.stack import Stack, stack
from tests.service.rawhttp import request
from tests.waiting import until, wait_until

STREAMS = 9
STREAM_TOKENS = 200  # about 5 s on the cpu profile: in flight through the whole scenario
TIMEOUT = aiohttp.ClientTimeout(total=120)


async def start_streams(up: Stack, session: aiohttp.ClientSession) -> tuple[list[asyncio.Task[Outcome]], list[int]]:
    """STREAMS streams spread by least-request, all running; returns them and how many each replica runs."""
    streams = []
    for _ in range(STREAMS):
        streams.append(asyncio.create_task(complete(session, up.envoy.url, STREAM_TOKENS, stream=True)))
        await asyncio.sleep(0.02)  # arrivals spaced, for least-request to see the earlier ones
    running = [0] * len(up.replicas)

    async def all_running() -> bool:
        running[:] = await asyncio.to_thread(lambda: [r.running() for r in up.replicas])
        return sum(running) == STREAMS

    await until(all_running, timeout=20.0, what="every stream running")
    return streams, running


def busiest(up: Stack, running: list[int]) -> tuple[Replica, list[Replica], int]:
    """The replica running the most streams (the one to stop), the others, and its stream count."""
    index = running.index(max(running))
    return up.replicas[index], up.replicas[:index] + up.replicas[index + 1:], running[index]


async def answered(replicas: list[Replica]) -> list[int]:
    return await asyncio.to_thread(lambda: [r.answered() for r in replicas])


async def draining(replica: Replica) -> bool:
    """What Envoy's health check sees once the signal is handled: 503, phase draining."""
    health = await asyncio.to_thread(request, "GET", replica.url + "/health")
    return (health.status, health.json()["status"]) == (503, "draining")


def test_a_rolling_restart_of_a_replica_under_load_fails_no_request(tmp_path: Path) -> None:
    """SIGTERM: the replica finishes its streams, takes no new request, exits 0, and no client request fails;
    started again on its address, Envoy's health check puts it back in rotation and requests still succeed."""
    with stack(3, tmp_path) as up:
        stopped = asyncio.run(_drain_scenario(up))
        assert stopped.proc.wait(timeout=30) == 0
        with restarted(stopped, tmp_path / "restarted.log") as again:
            wait_until(lambda: again.host in up.routed_to(), timeout=20.0, what="the restarted replica in rotation")
            after = asyncio.run(many(up.envoy.url, 12, tokens=2, stream=True, every_s=0.025))
    assert [o.status for o in after] == [200] * len(after)
    assert all(o.complete_stream for o in after)


async def _drain_scenario(up: Stack) -> Replica:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT) as session:
        streams, running = await start_streams(up, session)
        first, rest, on_first = busiest(up, running)
        before = await answered(rest)
        first.signal(signal.SIGTERM)
        await until(lambda: draining(first), timeout=10.0, what="/health saying draining")
        # New requests while Envoy has not yet seen the failed health check (503s retried elsewhere), then after.
        during = [await complete(session, up.envoy.url, 2)]
        while first.host in await asyncio.to_thread(up.routed_to):
            during.append(await complete(session, up.envoy.url, 2))
        after = await many(up.envoy.url, 10, tokens=2)
        done = await asyncio.gather(*streams)
    assert [o.status for o in during + after] == [200] * len(during + after)
    assert all(o.complete_stream for o in done), [o for o in done if not o.complete_stream][:1]
    gained = sum(await answered(rest)) - sum(before)
    assert gained == len(during) + len(after) + STREAMS - on_first  # the draining replica took no new request
    return first


def test_a_killed_replica_fails_only_its_own_streams(tmp_path: Path) -> None:
    with stack(3, tmp_path) as up:
        asyncio.run(_kill_scenario(up))


async def _kill_scenario(up: Stack) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT) as session:
        streams, running = await start_streams(up, session)
        first, _, on_first = busiest(up, running)
        first.signal(signal.SIGKILL)
        await asyncio.to_thread(first.proc.wait)
        # Its streams' resets eject it at once (update_merge_window 0s); a request sent there meanwhile is refused
        # a connection and retried on another replica.
        after = await many(up.envoy.url, 10, tokens=2)
        done = await asyncio.gather(*streams)
    assert [o.status for o in after] == [200] * len(after), [o.body for o in after if o.status != 200]
    lost = [o for o in done if not o.complete_stream]
    assert len(lost) == on_first and all(o.broken for o in lost), (on_first, lost)
