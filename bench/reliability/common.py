"""What the reliability runs share: the server's state as /metrics tells it, its resident memory, and a
tally of outcomes that says which targets held."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from bench.loadgen.promtext import gauge_values

NEIGHBOUR = {"prompt": "A neighbour's story", "max_tokens": 64, "stream": True, "ignore_eos": True}
_USED_BLOCKS = re.compile(r'^pagedserve:kv_cache_blocks\{state="used"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class EngineState:
    running: int
    waiting: int
    used_blocks: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0 and self.used_blocks == 0

    def __str__(self) -> str:
        return f"running {self.running}, waiting {self.waiting}, KV blocks held {self.used_blocks}"


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def metric_values(session: aiohttp.ClientSession, url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named samples of /metrics (labelled ones summed)."""
    values = gauge_values(await metrics_text(session, url))
    return {name: values.get(name, float("nan")) for name in names}


async def engine_state(session: aiohttp.ClientSession, url: str) -> EngineState:
    text = await metrics_text(session, url)
    gauges, used = gauge_values(text), _USED_BLOCKS.search(text)
    return EngineState(int(gauges.get("pagedserve:num_requests_running", -1)),
                       int(gauges.get("pagedserve:num_requests_waiting", -1)),
                       int(float(used.group(1))) if used else -1)


async def settle(session: aiohttp.ClientSession, url: str, timeout: float = 10.0) -> EngineState:
    """The engine's state once it is idle, or as it is when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    state = await engine_state(session, url)
    while not state.idle and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        state = await engine_state(session, url)
    return state


@dataclass
class Tally:
    """Counts of what happened, and the first few examples of anything that should not have."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str | None = None) -> None:
        self.counts[kind] += 1
        if example is not None and len(self.examples.setdefault(kind, [])) < 3:
            self.examples[kind].append(example[:300])

    def lines(self) -> list[str]:
        out = [f"  {kind:32s} {count}" for kind, count in sorted(self.counts.items())]
        for kind, shown in self.examples.items():
            out += [f"  e.g. {kind}: {text}" for text in shown]
        return out


def verdict(checks: dict[str, bool]) -> tuple[list[str], bool]:
    """One line per target, and whether all held."""
    return [f"  [{'ok' if ok else 'FAILED'}] {name}" for name, ok in checks.items()], all(checks.values())


async def neighbour(session: aiohttp.ClientSession, url: str, until: float, gaps: list[float],
                    tally: Tally | None = None) -> None:
    """A bystander: NEIGHBOUR streams one after another until `until`, each gap between its chunks recorded
    (and each answer's status, in `tally`)."""
    while time.monotonic() < until:
        async with session.post(url + "/v1/completions", json=NEIGHBOUR) as resp:
            if tally is not None:
                tally.add(f"neighbour: {resp.status}")
            last = None
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
