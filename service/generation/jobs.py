"""Run one HTTP request's generation on the engine: submit, then answer in one body or as Server-Sent Events.

However the handler ends (done, error, timeout, client gone and the handler cancelled), every engine
request it submitted that is still running is aborted, so its KV blocks go back to the pool.

A stream is `data: {chunk}` per engine output, an optional usage chunk, then `data: [DONE]`. An error after the
headers went out (engine failure, shutdown, timeout, a bug) ends every choice not yet ended with finish_reason
"abort" (vLLM's word for a cut request), then a final error event and [DONE], so the stream always ends cleanly
and no choice is left without a finish_reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from scheduler.errors import SchedulerError
from scheduler.outputs import ChoiceDelta, RequestOutput, RequestStream
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from service.generation.pacing import ActiveStreams, Pacer
from service.generation.state import EngineLike
from service.generation.transcript import Transcript
from service.openai.errors import JSON_CONTENT, APIError, engine_failure, from_engine, server_error, timed_out
from service.openai.formats import DONE, Formatter, Identity, running_usage, sse, usage_of
from service.openai.prompts import TokenIds
from service.openai.schemas.errors import ErrorBody
from service.openai.schemas.responses import Usage

log = logging.getLogger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Finals = list[RequestOutput | None]


@dataclass(frozen=True)
class Job:
    ident: Identity
    prompts: list[TokenIds]
    params: SamplingParams
    priority: int
    stream: bool
    include_usage: bool
    timeout_s: float
    events_per_s: float  # the pacing budget (see service.generation.pacing)
    # per prompt: the incoming trace (W3C traceparent) and request facts, for telemetry; () for none
    trace_contexts: tuple[Any, ...] = ()
    continuous_usage: bool = False  # the usage so far in every streamed chunk (vLLM's continuous_usage_stats)

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n


async def run_job(request: web.Request, engine: EngineLike, job: Job, fmt: Formatter,
                  active: ActiveStreams) -> web.StreamResponse:
    streams = submit_all(engine, job)
    try:
        if job.stream:
            with active:
                return await stream_job(request, engine, job, streams, fmt, Pacer(active, job.events_per_s))
        return await complete_job(engine, job, streams, fmt)
    finally:
        for stream in streams:
            if not stream.finished:
                engine.abort(stream.request_id)
        if isinstance(fmt, Transcript):
            fmt.log()


def submit_all(engine: EngineLike, job: Job) -> list[RequestStream]:
    streams: list[RequestStream] = []
    try:
        for i, ids in enumerate(job.prompts):
            base = job.ident.engine_id or job.ident.id
            rid, public = (base, job.ident.id) if len(job.prompts) == 1 else (f"{base}-{i}", f"{job.ident.id}-{i}")
            trace = job.trace_contexts[i] if job.trace_contexts else None
            request = EngineRequest(rid, ids, job.params, job.priority, trace_context=trace, public_id=public)
            streams.append(engine.submit(request))
    except SchedulerError as exc:
        for stream in streams:
            engine.abort(stream.request_id)
        raise from_engine(exc) from None
    return streams


async def complete_job(engine: EngineLike, job: Job, streams: list[RequestStream],
                       fmt: Formatter) -> web.Response:
    try:
        async with asyncio.timeout(job.timeout_s):
            finals = await asyncio.gather(*(s.collect() for s in streams))
    except TimeoutError:
        raise timed_out(job.timeout_s) from None
    failed = next((f for f in finals if f.error), None)
    if failed is not None and failed.error is not None:
        raise engine_failure(engine.accepting, failed.error, failed.error_code)
    body = fmt.response(_flatten(finals, job.params.n), usage_of(finals))
    return web.Response(body=msgspec.json.encode(body), content_type=JSON_CONTENT)


def _flatten(finals: list[RequestOutput], n: int) -> list[ChoiceDelta]:
    """Choices of every prompt in order: prompt i's choice j is choice i * n + j; one the engine never ended
    (it should not happen) says "abort" rather than no finish_reason."""
    by_index = {i * n + d.index: d for i, out in enumerate(finals) for d in out.choices}
    choices = [by_index.get(k) or ChoiceDelta(k) for k in range(len(finals) * n)]
    for choice in choices:
        choice.finish_reason = choice.finish_reason or "abort"
    return choices


async def stream_job(request: web.Request, engine: EngineLike, job: Job, streams: list[RequestStream],
                     fmt: Formatter, pacer: Pacer) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    ended: set[int] = set()  # the choices whose finish_reason went out
    try:
        await resp.prepare(request)
        tail = await _pump(resp, engine, job, streams, fmt, pacer, ended)
    except ConnectionError:
        return resp  # the client went away; run_job aborts what is left
    except Exception:  # a bug: the headers are gone, so say so in-band and end the stream cleanly
        log.exception("streaming %s failed", job.ident.id)
        tail = _after_bug(fmt, job, ended)
    try:
        await resp.write(tail)
        await resp.write_eof()
    except ConnectionError:
        pass
    return resp


async def _pump(resp: web.StreamResponse, engine: EngineLike, job: Job, streams: list[RequestStream],
                fmt: Formatter, pacer: Pacer, ended: set[int]) -> bytes:
    """Relay the outputs under the request's timeout; return what closes the stream."""
    finals: Finals = [None] * len(streams)
    try:
        async with asyncio.timeout(job.timeout_s):
            failed = await _relay(resp, job, streams, fmt, pacer, finals, ended)
    except TimeoutError:
        return cut(fmt, job, ended, timed_out(job.timeout_s))
    if failed is not None and failed.error is not None:
        return cut(fmt, job, ended, engine_failure(engine.accepting, failed.error, failed.error_code))
    usage = fmt.usage_chunk(usage_of([f for f in finals if f is not None])) if job.include_usage else b""
    return usage + DONE


async def _relay(resp: web.StreamResponse, job: Job, streams: list[RequestStream], fmt: Formatter,
                 pacer: Pacer, finals: Finals, ended: set[int]) -> RequestOutput | None:
    """One event per output (several choices' chunks in one write) until every stream ends; returns the
    output that ended a request with an engine error, if one did."""
    prompt_tokens = sum(len(ids) for ids in job.prompts)
    usage = running_usage(prompt_tokens, finals) if job.continuous_usage else None
    if preamble := fmt.preamble(job.num_choices, usage):
        await resp.write(preamble)
    n = job.params.n
    async with aclosing(merged(streams)) as outputs:
        async for i, out in outputs:
            finals[i] = out
            usage = running_usage(prompt_tokens, finals) if job.continuous_usage else None
            if data := _event(fmt, out, i * n, usage):
                await resp.write(data)
            ended.update(i * n + d.index for d in out.choices if d.finish_reason)
            if out.error:
                return out
            if not out.finished:
                await pacer.pace()
    return None


def _event(fmt: Formatter, out: RequestOutput, base: int, usage: Usage | None) -> bytes:
    if len(out.choices) == 1:  # the common case, without the generator
        delta = out.choices[0]
        return fmt.chunk(base + delta.index, delta, usage) if _worth(delta) else b""
    return b"".join(fmt.chunk(base + d.index, d, usage) for d in out.choices if _worth(d))


def _worth(delta: ChoiceDelta) -> bool:
    return bool(delta.text or delta.finish_reason or delta.logprobs)


async def merged(streams: list[RequestStream]) -> AsyncGenerator[tuple[int, RequestOutput]]:
    """Outputs of several streams as they come, tagged with the stream's position."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None]] = asyncio.Queue(maxsize=len(streams))
    tasks = [asyncio.create_task(_forward(i, s, queue)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            remaining -= item is None
            if item is not None:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()


async def _forward(i: int, stream: RequestStream, queue: asyncio.Queue[tuple[int, RequestOutput | None]]) -> None:
    async for out in stream:
        await queue.put((i, out))
    await queue.put((i, None))


def cut(fmt: Formatter, job: Job, ended: set[int], err: APIError) -> bytes:
    """The end of a stream cut short: every choice not yet ended finishes with "abort", then the error."""
    aborted = (fmt.chunk(k, ChoiceDelta(k, finish_reason="abort")) for k in range(job.num_choices) if k not in ended)
    return b"".join(aborted) + error_event(err) + DONE


def _after_bug(fmt: Formatter, job: Job, ended: set[int]) -> bytes:
    err = server_error("internal error while streaming")
    try:
        return cut(fmt, job, ended, err)
    except Exception:
        log.exception("ending %s's choices failed", job.ident.id)
        return error_event(err) + DONE


def error_event(err: APIError) -> bytes:
    return sse(msgspec.json.encode(ErrorBody(err.info())))
