"""Answer a job as Server-Sent Events: `data: {chunk}` per engine output, an optional usage chunk, then
`data: [DONE]`. An error after the headers went out (engine failure, shutdown, timeout, a bug) ends every choice
not yet ended with finish_reason "abort" (vLLM's word for a cut request), then a final error event and [DONE],
so the stream always ends cleanly and no choice is left without a finish_reason."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from scheduler.outputs import ChoiceDelta, RequestOutput, RequestStream
from service.errors import APIError, engine_failure, server_error, timed_out
from service.formats import DONE, Formatter, running_usage, sse, usage_of
from service.pacing import Pacer
from service.schemas.errors import ErrorBody
from service.schemas.responses import Usage
from service.state import EngineLike

if TYPE_CHECKING:
    from service.jobs import Job

log = logging.getLogger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Finals = list[RequestOutput | None]


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
