"""vLLM's POST /tokenize and POST /detokenize: the token ids the server would feed the model for a prompt or a
conversation (the chat endpoint's template and tokenizer, so `count` equals a completion's prompt_tokens), and
the text of token ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from backends.model.chat_template import ChatTemplate, ChatTemplateError
from service.generation.state import CONFIG_KEY, ENCODER_KEY, Runtime
from service.http.body import read_json
from service.openai.errors import bad_request
from service.openai.prompts import TokenIds, chat_prompt
from service.openai.schemas.requests import DetokenizeRequest, TokenizeRequest
from service.openai.schemas.responses import DetokenizeResponse, TokenizeResponse
from service.routes.common import json_response, read_chat_body, runtime_of, served_model

# No context-length check: a client asks /tokenize precisely to learn whether a text fits (vLLM does not refuse
# either); the body size limit bounds the work.
UNLIMITED = 2**62


async def tokenize(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    req = await read_chat_body(request, request.app[CONFIG_KEY].service, request.app[ENCODER_KEY], TokenizeRequest)
    served_model(request, req.model)
    ids = await (_prompt_ids if req.prompt is not None else _chat_ids)(request, req, runtime)
    strs = [runtime.tokenizer.fast.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
    return json_response(TokenizeResponse(len(ids), runtime.engine.max_model_len, list(ids), strs))


async def detokenize(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    req = await read_json(request, DetokenizeRequest, request.app[CONFIG_KEY].service)
    served_model(request, req.model)
    vocab = runtime.tokenizer.vocab_size
    bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is out of range (vocabulary size {vocab})", "tokens")
    return json_response(DetokenizeResponse(runtime.tokenizer.decode(req.tokens, skip_special_tokens=False)))


async def _prompt_ids(request: web.Request, req: TokenizeRequest, runtime: Runtime) -> TokenIds:
    if req.messages is not None:
        raise bad_request("give either prompt or messages, not both", "messages")
    assert req.prompt is not None
    special = True if req.add_special_tokens is None else req.add_special_tokens
    ids = await request.app[ENCODER_KEY].run(len(req.prompt), runtime.tokenizer.encode, req.prompt, special)
    return tuple(ids)


async def _chat_ids(request: web.Request, req: TokenizeRequest, runtime: Runtime) -> TokenIds:
    """The chat endpoint's own chat_prompt; continue_final_message ends the text with the final message."""
    if req.messages is None:
        raise bad_request("either prompt or messages is required", "prompt")
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt cannot both be true",
                          "continue_final_message")
    if req.add_special_tokens and runtime.tokenizer.fast.post_processor is not None:
        raise bad_request("add_special_tokens with messages is not supported for this model's tokenizer",
                          "add_special_tokens")
    # GGUF tokenizers have no post-processor: add_special_tokens adds nothing, the template spells them all.
    template = runtime.chat_template
    if req.continue_final_message:
        template = _Continued(template.source, template.bos_token, template.eos_token)
    return await request.app[ENCODER_KEY].off_loop(chat_prompt, req.messages, template, runtime.tokenizer, UNLIMITED,
                                                   req.add_generation_prompt, req.tools)


class _Continued(ChatTemplate):
    """The template, rendered up to the end of the final message's content (vLLM's and transformers'
    continue_final_message): the model continues that message instead of starting a new one."""

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        text = super().render(messages, add_generation_prompt=False, tools=tools)
        final = str(messages[-1].get("content") or "")
        for part in (final, final.strip()):  # as transformers: exactly, else without surrounding whitespace
            end = text.rfind(part) if part else -1
            if end >= 0:
                return text[:end + len(part)]
        raise ChatTemplateError("continue_final_message: the final message's content is not in the rendered "
                                "conversation (is it empty?)")

