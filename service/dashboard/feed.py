"""The dashboard's fan-out: each engine view encoded once, queued to every viewer without ever waiting on one.

The engine publishes on the event loop's thread, between steps. A viewer holds at most CAPACITY records; one
that reads too slowly loses its oldest (counted on /metrics, and told to the viewer), so a stalled browser costs
memory bounded by CAPACITY and never an engine step. With no viewer, `watching` is False and the engine builds
no view at all.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from telemetry.metrics import PREFIX

CAPACITY = 256  # records a viewer may fall behind by before its oldest are dropped
MAX_VIEWERS = 16
HEARTBEAT_S = 15.0  # a comment line this often while nothing happens keeps proxies from closing the stream
# A viewer's records are written together at most this often: steps of a millisecond or two would otherwise cost a
# task wake-up and a socket write each, on the engine's event loop. Well inside the 100 ms a page may lag.
COALESCE_S = 0.025


class TooManyViewersError(Exception):
    pass


def sse(event: str, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


class Viewer:
    """One connected page: its pending records, oldest first."""

    def __init__(self, capacity: int) -> None:
        self._pending: deque[bytes] = deque()
        self._capacity = capacity
        self._ready = asyncio.Event()
        self.dropped = 0
        self._told = 0  # drops already reported to the viewer
        self.closed = False

    def offer(self, record: bytes) -> bool:
        """Queue a record; False when the oldest had to go to make room."""
        kept = len(self._pending) < self._capacity
        if not kept:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(record)
        self._ready.set()
        return kept

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def forget_pending(self) -> None:
        """The records queued so far are older than the snapshot about to be sent: the page starts from it."""
        self._pending.clear()

    async def chunks(self, heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[bytes]:
        """What to write next: the records pending (after a `dropped` event when some were lost), gathered for up to
        COALESCE_S, or a heartbeat comment after heartbeat_s of nothing; ends when the feed closes."""
        while not self.closed:
            try:
                await asyncio.wait_for(self._ready.wait(), heartbeat_s)
            except TimeoutError:
                yield b": ping\n\n"
                continue
            await asyncio.sleep(COALESCE_S)
            self._ready.clear()
            if self.closed:
                return
            yield self._take()

    def _take(self) -> bytes:
        records = list(self._pending)
        self._pending.clear()
        if self.dropped != self._told:
            self._told = self.dropped
            records.insert(0, sse("dropped", msgspec.json.encode({"dropped": self.dropped})))
        return b"".join(records)


class DashboardFeed:
    """The engine's StepWatcher (scheduler/engine_view.py) for the dashboard's viewers."""

    def __init__(self, registry: CollectorRegistry, capacity: int = CAPACITY, max_viewers: int = MAX_VIEWERS) -> None:
        self._viewers: set[Viewer] = set()
        self._capacity, self._max_viewers = capacity, max_viewers
        self._encoder = msgspec.json.Encoder()
        self._dropped = Counter(PREFIX + "dashboard_records_dropped", "Dashboard records a slow viewer lost (its "
                                "oldest, to keep the newest)", registry=registry)
        self._gauge = Gauge(PREFIX + "dashboard_viewers", "Dashboard pages reading the live feed", registry=registry)

    @property
    def watching(self) -> bool:
        return bool(self._viewers)

    def publish(self, event: str, view: object) -> None:
        record = sse(event, self._encoder.encode(view))
        for viewer in self._viewers:
            if not viewer.offer(record):
                self._dropped.inc()

    def join(self) -> Viewer:
        if len(self._viewers) >= self._max_viewers:
            raise TooManyViewersError(f"{len(self._viewers)} dashboard viewers are connected, the most this "
                                      "server serves; close one and retry")
        viewer = Viewer(self._capacity)
        self._viewers.add(viewer)
        self._gauge.set(len(self._viewers))
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self._viewers.discard(viewer)
        self._gauge.set(len(self._viewers))

    def close(self) -> None:
        """The server stops: every viewer's stream ends (a page reconnects to whatever serves next)."""
        for viewer in self._viewers:
            viewer.close()
