"""The canary: one greedy request repeated all through a run, streaming and not by turns. Greedy decoding of a
fixed prompt has one right answer, so any change of its text means that other traffic leaked into it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp
import msgspec

from bench.loadgen.sse import DONE, EventSplitter, chunk_decoder

BODY = {"prompt": "The quick brown fox jumps over the lazy dog. Then", "max_tokens": 16, "temperature": 0,
        "ignore_eos": True}
TIMEOUT_S = 30.0


@dataclass
class CanaryLog:
    """The tally of a canary's checks (the first good answer is the reference)."""

    reference: str | None = None
    checks: int = 0
    mismatches: list[str] = field(default_factory=list)  # what came back instead, for the report

    def record(self, text: str | None, detail: str, stream: bool) -> None:
        self.checks += 1
        if self.reference is None and text is not None:
            self.reference = text
        elif text is None or text != self.reference:
            how = "streamed" if stream else "plain"
            self.mismatches.append(f"check {self.checks} ({how}): {detail or repr(text)}")


async def run_canary(session: aiohttp.ClientSession, base_url: str, stop: asyncio.Event,
                     interval_s: float = 0.2) -> CanaryLog:
    """Check every interval_s until `stop` is set, and once more after that (so at least twice)."""
    log, stream, stopped = CanaryLog(), False, False
    while not stopped:
        stopped = stop.is_set()
        text, detail = await canary_text(session, base_url + "/v1/completions", stream)
        log.record(text, detail, stream)
        stream = not stream
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
    return log


async def canary_text(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[str | None, str]:
    """The completion's text, or None and why there is none."""
    try:
        async with asyncio.timeout(TIMEOUT_S), session.post(url, json={**BODY, "stream": stream}) as resp:
            body = await resp.read()
            if resp.status != 200:
                return None, f"status {resp.status}: {body[:200]!r}"
            return _streamed_text(body) if stream else _plain_text(body)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _plain_text(body: bytes) -> tuple[str | None, str]:
    try:
        return msgspec.json.decode(body)["choices"][0]["text"], ""
    except (msgspec.DecodeError, KeyError, IndexError, TypeError) as exc:
        return None, f"unreadable body ({exc}): {body[:200]!r}"


def _streamed_text(body: bytes) -> tuple[str | None, str]:
    decode = chunk_decoder().decode
    events = EventSplitter().feed(body)
    if not events or events[-1] != DONE:
        return None, f"the stream did not end with [DONE]: {body[-200:]!r}"
    try:
        chunks = [decode(payload) for payload in events[:-1]]
    except msgspec.DecodeError as exc:
        return None, f"an unreadable event ({exc})"
    errors = [chunk.error for chunk in chunks if chunk.error is not None]
    return (None, f"in-band error: {errors[0]}") if errors else ("".join(c.content() for c in chunks), "")
