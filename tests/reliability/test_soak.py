"""A short soak in the test suite: a few hundred requests of every shape with a fifth of the clients hanging
up mid-way, on a pool small enough to preempt; then nothing may be left running, waiting or holding blocks,
and nobody may have seen a 5xx or a stream without its end (bench.reliability.soak is the long run)."""

from __future__ import annotations

import asyncio

import aiohttp

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from bench.reliability.common import EngineState, Tally, metric_values, settle
from bench.reliability.soak import SoakPlan, clients
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config.settings import AppConfig, ServiceConfig
from tests.service.live import LiveServer, cached_builder

PREEMPTIONS = "pagedserve:num_preemptions_total"


def test_a_short_soak_balances_the_books(model_files: ModelFiles) -> None:
    config = AppConfig(ServiceConfig(port=0), BackendConfig(name="sim", sim_profile="h200"),
                       SchedulerConfig(max_num_seqs=16), KVPoolConfig(num_blocks=96))
    server = LiveServer.start(config, cached_builder(model_files))
    plan, tally = SoakPlan(requests=300, concurrency=16, disconnect=0.2, seed=3), Tally()

    async def soak() -> tuple[EngineState, float]:
        await clients(server.url, plan, tally, lambda done: None)
        async with aiohttp.ClientSession() as session:
            counters = await metric_values(session, server.url, (PREEMPTIONS,))
            return await settle(session, server.url), counters[PREEMPTIONS]

    try:
        state, preemptions = asyncio.run(soak())
    finally:
        server.close()
    counts = tally.counts
    assert sum(counts.values()) == 300, tally.lines()
    assert set(counts) <= {"ok (plain)", "ok (stream)", "hung up (plain)", "hung up (stream)"}, tally.lines()
    assert counts["hung up (plain)"] + counts["hung up (stream)"] >= 30
    assert state.idle, state
    assert preemptions > 0  # the pool was small enough for the soak to cover preemption
