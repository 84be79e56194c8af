"""Run one HTTP request's generation on the engine: submit, then answer in one body (here) or as an SSE
stream (service.streaming).

However the handler ends (done, error, timeout, client gone and the handler cancelled), every engine
request it submitted that is still running is aborted, so its KV blocks go back to the pool.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from scheduler.errors import SchedulerError
from scheduler.outputs import ChoiceDelta, RequestOutput, RequestStream
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from service.errors import JSON_CONTENT, engine_failure, from_engine, timed_out
from service.formats import Formatter, Identity, usage_of
from service.pacing import ActiveStreams, Pacer
from service.prompts import TokenIds
from service.state import EngineLike
from service.streaming import stream_job
from service.transcript import Transcript


@dataclass(frozen=True)
class Job:
    ident: Identity
    prompts: list[TokenIds]
    params: SamplingParams
    priority: int
    stream: bool
    include_usage: bool
    timeout_s: float
    events_per_s: float  # the pacing budget (see service.pacing)
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
            rid = base if len(job.prompts) == 1 else f"{base}-{i}"
            trace = job.trace_contexts[i] if job.trace_contexts else None
            request = EngineRequest(rid, ids, job.params, job.priority, trace_context=trace)
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
