"""Drive a workload against a target: warm-up, then a closed loop (fixed concurrency) or an open loop (arrival
rate), until the request count or the time bound is reached; requests in flight then finish and count."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import aiohttp

from bench.loadgen.arrivals import arrival_times
from bench.loadgen.client import Client, RequestResult
from bench.loadgen.probes import Probe
from bench.loadgen.progress import NoProgress, Progress
from bench.loadgen.spec import Bounds, LoadShape, RequestSpec, Session, Target
from bench.loadgen.workloads import Workload

WARMUP_CONCURRENCY = 8  # warm-up parallelism when the shape sets none


@dataclass(frozen=True)
class RunRecord:
    """The measured requests of one run (warm-up excluded) and its wall-clock span."""

    shape: LoadShape
    bounds: Bounds
    results: tuple[RequestResult, ...]
    start: float
    end: float

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 1e-9)


class _Quota:
    """How many more requests may start: the count bound and the deadline."""

    def __init__(self, bounds: Bounds, now: float) -> None:
        self.left = bounds.num_requests if bounds.num_requests is not None else math.inf
        self.deadline = now + bounds.duration_s if bounds.duration_s is not None else math.inf

    def take(self, now: float) -> bool:
        if self.left <= 0 or now >= self.deadline:
            return False
        self.left -= 1
        return True


class _Collector:
    def __init__(self, progress: Progress) -> None:
        self.results: list[RequestResult] = []
        self.errors = 0
        self.progress = progress

    def add(self, result: RequestResult) -> None:
        self.results.append(result)
        self.errors += not result.ok
        self.progress.update(len(self.results), self.errors)


async def run_load(target: Target, workload: Workload, shape: LoadShape, bounds: Bounds,
                   progress: Progress | None = None, probes: Sequence[Probe] = ()) -> RunRecord:
    """Warm up, then measure; `probes` start after the warm-up and stop once the last request has ended."""
    if shape.rate is not None and math.isinf(shape.rate) and bounds.num_requests is None:
        raise ValueError("an infinite rate needs a request count")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        client = Client(http, target)
        sessions = workload.sessions()
        await warm_up(client, sessions, bounds.warmup, shape.concurrency or WARMUP_CONCURRENCY)
        for probe in probes:
            await probe.start(http)
        try:
            return await _measure(client, sessions, shape, bounds, progress or NoProgress())
        finally:
            for probe in probes:
                await probe.stop(http)


async def warm_up(client: Client, sessions: Iterator[Session], count: int, concurrency: int) -> None:
    """Send `count` first requests of the workload and drop their results; fail if none succeeds."""
    if count <= 0:
        return
    limiter = asyncio.Semaphore(concurrency)

    async def one(spec: RequestSpec) -> RequestResult:
        async with limiter:
            return await client.send(spec, uuid.uuid4().hex)

    results = await asyncio.gather(*(one(next(sessions).first()) for _ in range(count)))
    if not any(r.ok for r in results):
        first = results[0]
        raise ConnectionError(f"warm-up: all {count} requests failed ({first.error}: {first.detail})")


async def _measure(client: Client, sessions: Iterator[Session], shape: LoadShape, bounds: Bounds,
                   progress: Progress) -> RunRecord:
    sink = _Collector(progress)
    progress.started(shape.label(), bounds.num_requests, bounds.duration_s)
    start = client.clock()
    quota = _Quota(bounds, start)
    try:
        if shape.rate is None:
            assert shape.concurrency is not None
            await _closed_loop(client, sessions, quota, shape.concurrency, sink.add)
        else:
            await _open_loop(client, sessions, quota, shape, sink.add)
    finally:
        progress.finished()
    return RunRecord(shape, bounds, tuple(sink.results), start, client.clock())


async def _closed_loop(client: Client, sessions: Iterator[Session], quota: _Quota, concurrency: int,
                       sink: Callable[[RequestResult], None]) -> None:
    async def worker() -> None:
        while await _run_session(client, next(sessions), quota, sink, None, reserved=False):
            pass

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(client: Client, sessions: Iterator[Session], quota: _Quota, shape: LoadShape,
                     sink: Callable[[RequestResult], None]) -> None:
    assert shape.rate is not None
    limiter = asyncio.Semaphore(shape.concurrency) if shape.concurrency else None
    tasks: list[asyncio.Task[bool]] = []
    t0 = client.clock()
    for at, session in zip(arrival_times(shape.rate, shape.burstiness, shape.seed), sessions, strict=False):
        delay = t0 + at - client.clock()
        await asyncio.sleep(max(delay, 0.0))  # also lets started requests run when arrivals are late
        if not quota.take(client.clock()):  # the session's first request is reserved here
            break
        tasks.append(asyncio.create_task(_run_session(client, session, quota, sink, limiter, reserved=True)))
    await asyncio.gather(*tasks)


async def _run_session(client: Client, session: Session, quota: _Quota, sink: Callable[[RequestResult], None],
                       limiter: asyncio.Semaphore | None, reserved: bool) -> bool:
    """Send the session's requests in order, all under one session id; False when the bounds stopped it."""
    spec: RequestSpec | None = session.first()
    session_id = uuid.uuid4().hex
    while spec is not None:
        if not reserved and not quota.take(client.clock()):
            return False
        reserved = False
        result = await _send(client, spec, session_id, limiter)
        sink(result)
        if not result.ok:
            return True
        spec = session.follow(spec, result.text)
    return True


async def _send(client: Client, spec: RequestSpec, session_id: str,
                limiter: asyncio.Semaphore | None) -> RequestResult:
    if limiter is None:
        return await client.send(spec, session_id)
    async with limiter:
        return await client.send(spec, session_id)
