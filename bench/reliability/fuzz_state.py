"""The server's state after a run: from its /metrics, requests still running or waiting and KV blocks in use;
from its log, the exceptions it logged with a traceback."""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# What must be back to zero: (sample name, labels it must have), by name in the report.
GAUGES = {
    "running": ("pagedserve:num_requests_running", {}),
    "waiting": ("pagedserve:num_requests_waiting", {}),
    "kv blocks used": ("pagedserve:kv_cache_blocks", {"state": "used"}),
}
# The exception line that ends a traceback: the first unindented line after "Traceback (most recent call last):".
_RAISED = re.compile(r"^Traceback \(most recent call last\):\n(?:[ \t].*\n|\n)*([^\n]*)", re.MULTILINE)


async def settled_state(session: aiohttp.ClientSession, base_url: str, wait_s: float = 10.0) -> dict[str, float]:
    """The gauges once they are all zero, or as they are after wait_s (requests cut short finish cleaning up
    a moment after their clients have gone)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        state = await gauges(session, base_url)
        if all(v == 0 for v in state.values()) or asyncio.get_running_loop().time() > deadline:
            return state
        await asyncio.sleep(0.2)


async def gauges(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """GAUGES' values (NaN for one the server does not export)."""
    async with session.get(base_url + "/metrics") as resp:
        text = await resp.text()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return {name: next((s.value for s in samples if s.name == metric and labels.items() <= s.labels.items()),
                       math.nan)
            for name, (metric, labels) in GAUGES.items()}


def logged_exceptions(log: str) -> Counter[str]:
    """The tracebacks in a log, by the exception that ends each (a chained exception shows one per link)."""
    return Counter(m.group(1).split(":", 1)[0].strip() or "?" for m in _RAISED.finditer(log))
