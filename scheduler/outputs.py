"""What a request's reader receives, and the collector that merges it when the reader is slow.

The engine never blocks on a reader: each step it merges new deltas into the request's collector and wakes
the reader. A slow reader simply gets bigger deltas later, so memory is bounded by the output itself and a
stalled client cannot stall the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass
class ChoiceDelta:
    """New output of one choice (index < n) since the reader last looked."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    stop_reason: str | int | None = None  # the stop string or token id that ended it, if any

    def merge(self, later: ChoiceDelta) -> None:
        self.text += later.text
        self.token_ids += later.token_ids
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason = later.finish_reason or self.finish_reason
        self.stop_reason = later.stop_reason if later.stop_reason is not None else self.stop_reason


@dataclass(slots=True)
class _Pending:
    """A choice's output that its reader has not taken yet, kept as lists so adding a token is O(1)."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.texts.append(delta.text)
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        self.finish_reason = delta.finish_reason or self.finish_reason
        self.stop_reason = delta.stop_reason if delta.stop_reason is not None else self.stop_reason

    def delta(self, index: int) -> ChoiceDelta:
        return ChoiceDelta(index, "".join(self.texts), self.token_ids, self.logprobs, self.finish_reason,
                           self.stop_reason)


@dataclass
class RequestOutput:
    """One read: the merged deltas per choice, usage so far, and whether the request is over."""

    request_id: str
    choices: list[ChoiceDelta]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finished: bool = False
    error: str | None = None  # set when the request failed (the stream then ends)
    error_code: str | None = None  # the kind of failure when it has one (scheduler.errors.KV_CACHE_EXHAUSTED)


class RequestStream:
    """Async iterator over a request's merged outputs; the engine is the only writer."""

    def __init__(self, request_id: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._pending: dict[int, _Pending] = {}
        self._completion_tokens = 0
        self._cached_tokens = 0
        self._finished = False
        self._error: str | None = None
        self._error_code: str | None = None
        self._delivered_end = False
        self._ready = asyncio.Event()

    # --- engine side ---
    def put(self, delta: ChoiceDelta, completion_tokens: int, cached_tokens: int = 0) -> None:
        self._pending_for(delta.index).add(delta)
        self.publish(completion_tokens, cached_tokens)

    def add_token(self, index: int, text: str, token_id: int, logprob: TokenLogprob | None) -> None:
        """One new token of a choice; the reader sees it at the next publish() (once per step, not per token)."""
        pending = self._pending.get(index) or self._pending_for(index)
        pending.texts.append(text)
        pending.token_ids.append(token_id)
        if logprob is not None:
            if pending.logprobs is None:
                pending.logprobs = []
            pending.logprobs.append(logprob)

    def end_choice(self, index: int, finish_reason: str | None, stop_reason: str | int | None) -> None:
        self._pending_for(index).add(ChoiceDelta(index, finish_reason=finish_reason, stop_reason=stop_reason))

    def publish(self, completion_tokens: int, cached_tokens: int = 0) -> None:
        """Usage so far; wakes the reader."""
        self._completion_tokens = completion_tokens
        self._cached_tokens = cached_tokens
        self._ready.set()

    def _pending_for(self, index: int) -> _Pending:
        pending = self._pending.get(index)
        if pending is None:
            pending = self._pending[index] = _Pending()
        return pending

    def finish(self, error: str | None = None, code: str | None = None) -> None:
        self._finished = True
        self._error, self._error_code = error, code
        self._ready.set()

    @property
    def finished(self) -> bool:
        return self._finished

    # --- reader side ---
    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._delivered_end:
            raise StopAsyncIteration
        await self._ready.wait()
        self._ready.clear()
        return self._take()

    def _take(self) -> RequestOutput:
        choices = [self._pending[i].delta(i) for i in sorted(self._pending)]
        self._pending = {}
        self._delivered_end = self._finished
        return RequestOutput(self.request_id, choices, self.prompt_tokens, self._completion_tokens,
                             self._cached_tokens, self._finished, self._error, self._error_code)

    def take_finished(self) -> RequestOutput:
        """Everything at once, without an event loop, once the request is over and nobody read it."""
        if not self._finished:
            raise RuntimeError(f"request {self.request_id} is still running")
        return self._take()

    async def collect(self) -> RequestOutput:
        """Read to the end and merge everything (for non-streaming responses)."""
        merged: dict[int, ChoiceDelta] = {}
        last: RequestOutput | None = None
        async for out in self:
            for delta in out.choices:
                merged.setdefault(delta.index, ChoiceDelta(delta.index)).merge(delta)
            last = out
        assert last is not None
        last.choices = [merged[i] for i in sorted(merged)]
        return last
