"""What every generation route does first: find the runtime, read a chat body within its bounds, check the model,
build the job."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import msgspec
from aiohttp import web

from backends.model.tokenizer import Tokenizer
from scheduler.errors import echoed
from scheduler.params import SamplingParams
from scheduler.stop import cut_at_stop
from service.config.settings import ServiceConfig
from service.generation.jobs import Job
from service.generation.state import CONFIG_KEY, STATE_KEY, Phase, Runtime
from service.generation.tokenize import PromptEncoder
from service.http.body import parse_json, read_body
from service.http.ids import engine_id, remember_traceresponse, request_id_of
from service.openai.chat_bounds import ChatLimits, Context, check_shape
from service.openai.errors import (
    JSON_CONTENT,
    RETRY_AFTER_S,
    APIError,
    bad_request,
    engine_failed,
    shutting_down,
    unavailable,
)
from service.openai.formats import Identity
from service.openai.prompts import TokenIds
from service.openai.schemas.requests import CommonRequest
from telemetry import RequestContext, extract_context

MAX_CHOICES = 128  # prompts x n in one request
REFUSAL_PACE = 20  # a refused chat body's answer waits this many times what counting it took (~1 ms a MB)
T = TypeVar("T")


def json_response(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=JSON_CONTENT, headers=headers)


def runtime_of(request: web.Request) -> Runtime:
    state = request.app[STATE_KEY]
    if state.phase is Phase.READY and state.runtime is not None:
        return state.runtime
    if state.phase is Phase.LOADING:
        raise unavailable("the model is still loading", "model_loading", retry_after=RETRY_AFTER_S)
    if state.phase is Phase.FAILED:
        raise unavailable(f"the model failed to load: {state.failure}", "model_load_failed")
    if state.phase is Phase.UNHEALTHY:
        raise engine_failed(state.failure)
    raise shutting_down()


async def read_chat_body(request: web.Request, service: ServiceConfig, encoder: PromptEncoder, type_: type[T],
                         context: Context | None = None) -> T:
    """A body with messages and tools: counted (against `context` too, when given) before it is decoded in full
    (service/openai/chat_bounds.py), off the loop when it is big."""
    body = await read_body(request, service.max_body_bytes, service.read_timeout_s)
    started = time.perf_counter()
    try:
        check_shape(body, ChatLimits(service.max_messages, service.max_tools, service.max_tool_bytes), context)
    except APIError:
        await pace_refusal(time.perf_counter() - started)
        raise
    return await encoder.run(len(body), parse_json, body, type_)


async def pace_refusal(spent_s: float) -> None:
    """A refused request cost the event loop `spent_s`; its sender waits REFUSAL_PACE times that for the answer,
    so a client posting such bodies back to back gets the loop a small share of the time, not all of it."""
    await asyncio.sleep(REFUSAL_PACE * spent_s)


def served_model(request: web.Request, asked: str | None) -> str:
    state = request.app[STATE_KEY]
    name = state.model_name
    if asked is not None and asked not in state.model_names:
        raise APIError(404, f"The model `{echoed(asked)}` does not exist (this server serves `{name}`).",
                       param="model", code="model_not_found")
    return name


def check_choices(num_prompts: int, n: int) -> None:
    """Checked before tokenizing too: a list of a million prompts is refused before a million encodes."""
    if num_prompts * n > MAX_CHOICES:
        raise bad_request(f"at most {MAX_CHOICES} choices (prompts x n) per request", "n")


def make_job(request: web.Request, prefix: str, model: str, prompts: list[TokenIds], params: SamplingParams,
             req: CommonRequest) -> Job:
    check_choices(len(prompts), params.n)
    service = request.app[CONFIG_KEY].service
    ident = Identity(f"{prefix}-{request_id_of(request)}", int(time.time()), model, engine_id(request, prefix))
    options = req.stream_options
    include_usage = bool(req.stream and options and options.include_usage)
    operation = "chat" if prefix == "chatcmpl" else "text_completion"
    return Job(ident, prompts, params, req.priority, bool(req.stream), include_usage, service.request_timeout_s,
               service.max_stream_events_per_s, trace_contexts(request, model, operation, prompts, params),
               include_usage and bool(options and options.continuous_usage_stats))


def trace_contexts(request: web.Request, model: str, operation: str, prompts: list[TokenIds], params: SamplingParams
                   ) -> tuple[RequestContext, ...]:
    """One per prompt; with record_content on, each carries its prompt's text (as the model sees it, chat
    template included) for the request span, and the decoder of its completion. Off, no text is even decoded."""
    base = replace(extract_context(request.headers, model=model, operation=operation),
                   request_id=request_id_of(request))
    runtime, record = runtime_of(request), request.app[CONFIG_KEY].telemetry.record_content
    contexts = tuple(_context(runtime, record, base, ids, params) for ids in prompts)
    if contexts:
        remember_traceresponse(request, contexts[0])  # traceresponse names the first prompt's span (one per prompt)
    return contexts


def _context(runtime: Runtime, record: bool, base: RequestContext, prompt: TokenIds, params: SamplingParams
             ) -> RequestContext:
    """One prompt's context: its request span's ids reserved now (when traced) for the traceresponse header,
    and its text (and the decoder for its completion) when `record` (record_content) is on."""
    context = runtime.telemetry.reserve(base) if runtime.telemetry is not None else base
    if not record:
        return context
    return replace(context, prompt=runtime.tokenizer.decode(prompt, skip_special_tokens=False),
                   decode=functools.partial(_completion_text, runtime.tokenizer, params))  # on the telemetry worker


def _completion_text(tokenizer: Tokenizer, params: SamplingParams, token_ids: Sequence[int]) -> str:
    """A completion's text as its client got it: special tokens as the request asked, cut at a stop string."""
    text = tokenizer.decode(token_ids, skip_special_tokens=params.skip_special_tokens)
    return cut_at_stop(text, params.stop, params.include_stop_str_in_output)
