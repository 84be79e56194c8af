"""What every generation route does first: find the runtime, check the model, build the job."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import replace

import msgspec
from aiohttp import web

from backends.model.tokenizer import Tokenizer
from scheduler.errors import echoed
from scheduler.params import SamplingParams
from scheduler.stop import cut_at_stop
from service.generation.jobs import Job
from service.generation.state import CONFIG_KEY, STATE_KEY, Phase, Runtime
from service.http.request_id import engine_id, request_id_of
from service.http.traceresponse import remember
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
        remember(request, contexts[0])  # traceresponse names the first prompt's span (one per prompt)
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
