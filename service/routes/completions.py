"""POST /v1/completions and POST /v1/chat/completions."""

from __future__ import annotations

from aiohttp import web

from scheduler.guided import GuideFactory, GuideSpec
from service.generation.jobs import Job, run_job
from service.generation.state import CONFIG_KEY, ENCODER_KEY, STATE_KEY, Runtime
from service.generation.tokenize import prompt_chars
from service.generation.transcript import Transcript
from service.http.body import read_json
from service.openai.chat_bounds import Context, check_length
from service.openai.errors import bad_request
from service.openai.formats import ChatFormatter, CompletionFormatter, Formatter
from service.openai.params import chat_params, completion_params, guide_of, has_constraint
from service.openai.prompts import (
    chat_prompt,
    check_context,
    completion_prompts,
    encode_limit,
    num_prompts,
    truncated,
    truncation,
)
from service.openai.schemas.requests import ChatRequest, CompletionRequest
from service.openai.tools import NO_TOOLS, ToolUse, tool_use
from service.routes.common import check_choices, make_job, read_chat_body, runtime_of, served_model


async def create_completion(request: web.Request) -> web.StreamResponse:
    runtime = runtime_of(request)
    req = await read_json(request, CompletionRequest, request.app[CONFIG_KEY].service)
    model = served_model(request, req.model)
    guide = await request.app[ENCODER_KEY].off_loop(guide_of, req, runtime.guides) if has_constraint(req) else None
    params = completion_params(req, guide)
    check_choices(num_prompts(req.prompt), params.n)
    max_len = runtime.engine.max_model_len
    keep = truncation(req.truncate_prompt_tokens, max_len)
    prompts = await request.app[ENCODER_KEY].run(prompt_chars(req.prompt), completion_prompts, req.prompt,
                                                 runtime.tokenizer, encode_limit(max_len, keep))
    prompts = truncated(prompts, keep)
    check_context(prompts, params.max_tokens, max_len, "prompt")
    job = make_job(request, "cmpl", model, prompts, params, req)
    fmt = _logged(request, CompletionFormatter(job.ident, runtime.tokenizer, req.logprobs), job, runtime)
    return await run_job(request, runtime.engine, job, fmt, request.app[STATE_KEY].streams)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    """Everything whose cost grows with the request (decoding a big body, tools, rendering, tokenizing) runs on
    the tokenizer threads, after the cheap checks of service/openai/chat_bounds.py have bounded it."""
    runtime, encoder = runtime_of(request), request.app[ENCODER_KEY]
    max_len = runtime.engine.max_model_len
    req = await read_chat_body(request, request.app[CONFIG_KEY].service, encoder, ChatRequest,
                               Context(runtime.prompt_bound, max_len))
    model = served_model(request, req.model)
    keep = truncation(req.truncate_prompt_tokens, max_len)
    if keep is None:
        check_length(req.messages, runtime.prompt_bound, runtime.tokenizer, max_len)
    tools, guide = (await encoder.off_loop(_chat_guidance, req, runtime.guides)
                    if has_constraint(req) or req.tools or req.tool_choice is not None else (NO_TOOLS, None))
    params = chat_params(req, guide)
    prompt = await encoder.off_loop(chat_prompt, req.messages, runtime.chat_template, runtime.tokenizer,
                                    encode_limit(max_len, keep), req.add_generation_prompt, tools.offered)
    prompts = truncated([prompt], keep)
    check_context(prompts, params.max_tokens, max_len, "messages")
    job = make_job(request, "chatcmpl", model, prompts, params, req)
    fmt = _logged(request, ChatFormatter(job.ident, runtime.tokenizer, bool(req.logprobs), tools.parse,
                                         1 if req.parallel_tool_calls is False else None), job, runtime)
    return await run_job(request, runtime.engine, job, fmt, request.app[STATE_KEY].streams)


def _chat_guidance(req: ChatRequest, guides: GuideFactory | None) -> tuple[ToolUse, GuideSpec | None]:
    """The request's tools and its one grammar: a forced tool call's, or the constraint it asked for."""
    tools, asked = tool_use(req, guides), guide_of(req, guides)
    if tools.guide is not None and asked is not None:
        raise bad_request("a forced tool call (tool_choice) cannot be combined with response_format or guided_*",
                          "tool_choice")
    return tools, tools.guide or asked


def _logged(request: web.Request, fmt: Formatter, job: Job, runtime: Runtime) -> Formatter:
    """`fmt`, recording what it writes when `log_prompts` is on (off, nothing of the transcript runs)."""
    if not request.app[CONFIG_KEY].service.log_prompts:
        return fmt
    return Transcript(fmt, job.ident.id, job.prompts, runtime.tokenizer)
