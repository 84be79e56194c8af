"""Pacing of SSE events under load.

Every event costs the server a socket write (a syscall plus aiohttp's framing), paid on the same core as
the engine. At high concurrency one event per token per stream would spend most of that core on writes and
starve the engine. So all streams together send at most `budget` events per second: each stream waits
`active_streams / budget` seconds after an event before taking the next output, and whatever the engine
produced meanwhile is merged into that one event (the request's output collector merges for free). A
stream whose model is slower than its share is never delayed, and the first event is never delayed.
"""

from __future__ import annotations

import asyncio


class ActiveStreams:
    """How many SSE responses are open right now."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> ActiveStreams:
        self.count += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.count -= 1


class Pacer:
    def __init__(self, streams: ActiveStreams, budget: float) -> None:
        self._streams = streams
        self._budget = budget
        self._loop = asyncio.get_running_loop()
        self._last = -1e9

    async def pace(self) -> None:
        """Call after writing an event: returns when the stream may write its next one."""
        if self._budget <= 0:
            return
        now = self._loop.time()
        delay = self._last + self._streams.count / self._budget - now
        if delay > 0:
            await asyncio.sleep(delay)
            now += delay
        self._last = now
