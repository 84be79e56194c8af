"""One streaming request, timed at each content chunk's arrival."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import msgspec

from bench.loadgen.spec import RequestSpec, Target
from bench.loadgen.sse import DONE, Chunk, EventSplitter, chunk_decoder

Clock = Callable[[], float]
ERROR_DETAIL_CHARS = 300


@dataclass(frozen=True)
class RequestResult:
    """What one request did. Times are seconds on the client's monotonic clock."""

    start: float
    end: float
    prompt: str = ""  # the prompt's text (chat: the messages' contents), to count it when usage is missing
    chunk_times: tuple[float, ...] = ()  # arrival of each chunk that carried text
    text: str = ""
    prompt_tokens: int | None = None  # from the server's usage chunk, when it sent one
    output_tokens: int | None = None
    error: str = ""  # "" on success; else what went wrong, for grouping: "HTTP 503", "timeout", ...
    detail: str = ""  # the error's message, shortened

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class _Recorder:
    start: float
    prompt: str
    decode: Callable[[bytes], Chunk]
    times: list[float] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    usage: tuple[int | None, int | None] = (None, None)
    error: str = ""
    detail: str = ""
    done: bool = False
    answered: bool = False  # the response's status line arrived

    def event(self, payload: bytes, now: float) -> None:
        if payload == DONE:
            self.done = True
            return
        try:
            chunk = self.decode(payload)
        except msgspec.DecodeError:
            self.fail("malformed event", payload.decode("utf-8", "replace"))
            return
        if text := chunk.content():
            self.times.append(now)
            self.parts.append(text)
        if chunk.usage is not None:
            self.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        if kind := chunk.error_kind():
            self.fail(kind, str(chunk.error))

    def fail(self, error: str, detail: str = "") -> None:
        if not self.error:
            self.error, self.detail = error, detail[:ERROR_DETAIL_CHARS]

    def result(self, end: float) -> RequestResult:
        if not self.error and not self.done:
            self.fail("stream ended without [DONE]")
        return RequestResult(self.start, end, self.prompt, tuple(self.times), "".join(self.parts), *self.usage,
                             error=self.error, detail=self.detail)


def request_body(target: Target, spec: RequestSpec) -> dict[str, object]:
    body: dict[str, object] = {"max_tokens": spec.max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}}
    if target.endpoint == "chat":
        body["messages"] = [{"role": role, "content": content} for role, content in spec.chat_messages()]
    else:
        body["prompt"] = spec.completion_prompt()
    if target.model:
        body["model"] = target.model
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.temperature is not None:
        body["temperature"] = spec.temperature
    return body


def _prompt_text(target: Target, spec: RequestSpec) -> str:
    if target.endpoint == "chat":
        return "\n".join(content for _, content in spec.chat_messages())
    return spec.completion_prompt()


STALE_CONNECTION_TRIES = 8  # a request's sends, while each meets a pooled connection the server has closed


class Client:
    """Sends requests to one target over a shared connection pool."""

    def __init__(self, session: aiohttp.ClientSession, target: Target, clock: Clock = time.perf_counter) -> None:
        self.session = session
        self.target = target
        self.clock = clock
        self._decode = chunk_decoder().decode
        self._headers = target.headers()

    async def send(self, spec: RequestSpec, session_id: str | None = None) -> RequestResult:
        """Send one request; `session_id` goes in the target's session header, when it names one."""
        body = msgspec.json.encode(request_body(self.target, spec))
        rec = _Recorder(self.clock(), _prompt_text(self.target, spec), self._decode)
        try:
            async with asyncio.timeout(self.target.timeout_s):
                await self._exchange(body, rec, self._headers_for(session_id))
        except TimeoutError:
            rec.fail("timeout")
        except (aiohttp.ClientError, OSError) as exc:
            rec.fail(type(exc).__name__, str(exc))
        return rec.result(self.clock())

    def _headers_for(self, session_id: str | None) -> dict[str, str]:
        name = self.target.session_header
        return {**self._headers, name: session_id} if name and session_id else self._headers

    async def _exchange(self, body: bytes, rec: _Recorder, headers: dict[str, str]) -> None:
        """One exchange, sent again when a pooled connection turns out closed before any answer: some servers
        (llama-server's cpp-httplib) close the connection after a streamed response without `Connection: close`,
        and a request written on it before the close is seen never reaches them. Several streams ending together
        leave several such connections in the pool, and each try discards one."""
        for tries_left in range(STALE_CONNECTION_TRIES - 1, -1, -1):
            try:
                await self._exchange_once(body, rec, headers)
                return
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if rec.answered or not tries_left:
                    raise
                await asyncio.sleep(0)  # the loop reads the closes that have arrived: those connections leave the pool

    async def _exchange_once(self, body: bytes, rec: _Recorder, headers: dict[str, str]) -> None:
        async with self.session.post(self.target.url, data=body, headers=headers) as resp:
            rec.answered = True
            if resp.status != 200:
                rec.fail(f"HTTP {resp.status}", await resp.text(errors="replace"))
                return
            splitter = EventSplitter()
            async for data in resp.content.iter_any():
                now = self.clock()
                for payload in splitter.feed(data):
                    rec.event(payload, now)
                if rec.done or rec.error:
                    return
