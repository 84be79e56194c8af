"""Probes watch the server during the measured part of a run, over plain HTTP: a /metrics scrape at its start
and end (for the histogram cross-check) and a sampler of Prometheus gauges (e.g. running requests)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from bench.loadgen.promtext import gauge_values


class Probe(Protocol):
    async def start(self, http: aiohttp.ClientSession) -> None: ...

    async def stop(self, http: aiohttp.ClientSession) -> None: ...


async def fetch_metrics(http: aiohttp.ClientSession, base_url: str) -> str:
    async with http.get(base_url.rstrip("/") + "/metrics") as resp:
        resp.raise_for_status()
        return await resp.text()


@dataclass
class MetricsSnapshots:
    """The /metrics text just before and just after the measured requests ("" when the scrape failed)."""

    base_url: str
    before: str = ""
    after: str = ""
    error: str = ""
    settle_s: float = 0.3  # a server may record a finished request's metrics a moment after its stream ends

    async def start(self, http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(self.settle_s)  # the warm-up's last observations land before, not during, the run
        self.before = await self._scrape(http)

    async def stop(self, http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(self.settle_s)
        self.after = await self._scrape(http)

    async def _scrape(self, http: aiohttp.ClientSession) -> str:
        try:
            return await fetch_metrics(http, self.base_url)
        except (aiohttp.ClientError, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            return ""


@dataclass
class GaugeSampler:
    """Samples the named gauges every `interval_s` while the run lasts."""

    base_url: str
    names: tuple[str, ...]
    interval_s: float = 0.1
    samples: dict[str, list[float]] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # seconds since start, one per scrape
    _task: asyncio.Task[None] | None = None

    async def start(self, http: aiohttp.ClientSession) -> None:
        self.samples, self.times = {name: [] for name in self.names}, []
        self._task = asyncio.create_task(self._poll(http, time.monotonic()))

    async def stop(self, http: aiohttp.ClientSession) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self, http: aiohttp.ClientSession, t0: float) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                values = gauge_values(await fetch_metrics(http, self.base_url))
                self.times.append(time.monotonic() - t0)
                for name in self.names:
                    self.samples[name].append(values.get(name, math.nan))
            await asyncio.sleep(self.interval_s)

    def peak(self, name: str) -> float:
        return max(self._present(name), default=math.nan)

    def mean(self, name: str) -> float:
        values = self._present(name)
        return sum(values) / len(values) if values else math.nan

    def _present(self, name: str) -> list[float]:
        return [v for v in self.samples.get(name, ()) if not math.isnan(v)]
