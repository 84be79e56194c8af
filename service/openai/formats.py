"""Engine outputs -> OpenAI bodies and SSE events, one formatter per endpoint.

A formatter is made per HTTP request: it knows the response's id, creation time and model, and (for the
completions API) each choice's running text offset for logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from backends.model.tokenizer import Tokenizer
from scheduler.outputs import ChoiceDelta, RequestOutput
from service.openai.logprobs import chat_logprobs, completion_logprobs
from service.openai.schemas.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatCompletion,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    FunctionCallOut,
    FunctionDelta,
    PromptTokensDetails,
    ToolCallDelta,
    ToolCallOut,
    Usage,
)
from service.openai.tool_calls import CallDelta, ToolCallParser, parse_tool_calls

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Identity:
    id: str  # the response's: the endpoint's prefix and the X-Request-Id
    created: int
    model: str
    engine_id: str = ""  # the engine's request id (unique per request); "": the response's id


class Formatter(Protocol):
    def preamble(self, num_choices: int, usage: Usage | None = None) -> bytes: ...

    def chunk(self, index: int, delta: ChoiceDelta, usage: Usage | None = None) -> bytes:
        """One choice's event; `usage` (the usage so far) when the client asked for it in every chunk."""
        ...

    def usage_chunk(self, usage: Usage) -> bytes: ...

    def response(self, choices: list[ChoiceDelta], usage: Usage) -> Any: ...


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def running_usage(prompt_tokens: int, latest: list[RequestOutput | None]) -> Usage:
    """The usage so far of a job whose prompts have `prompt_tokens` in all, from each request's latest output
    (None: no output yet)."""
    outs = [out for out in latest if out is not None]
    completion = sum(out.completion_tokens for out in outs)
    cached = sum(out.cached_tokens for out in outs)
    return Usage(prompt_tokens, completion, prompt_tokens + completion, PromptTokensDetails(cached))


def usage_of(finals: list[RequestOutput]) -> Usage:
    prompt = sum(out.prompt_tokens for out in finals)
    completion = sum(out.completion_tokens for out in finals)
    cached = sum(out.cached_tokens for out in finals)
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))


class CompletionFormatter:
    def __init__(self, ident: Identity, tokenizer: Tokenizer, logprobs: int | None) -> None:
        self._ident = ident
        self._tokenizer = tokenizer
        self._logprobs = logprobs
        self._offsets: dict[int, int] = {}
        self._encode = msgspec.json.Encoder().encode

    def preamble(self, num_choices: int, usage: Usage | None = None) -> bytes:
        return b""

    def chunk(self, index: int, delta: ChoiceDelta, usage: Usage | None = None) -> bytes:
        choice = CompletionChoice(index, delta.text, self._lp(index, delta), delta.finish_reason)
        return sse(self._encode(self._chunk([choice], usage)))

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(self._encode(self._chunk([], usage)))

    def response(self, choices: list[ChoiceDelta], usage: Usage) -> Completion:
        out = [CompletionChoice(i, d.text, self._lp(i, d), d.finish_reason) for i, d in enumerate(choices)]
        return Completion(self._ident.id, "text_completion", self._ident.created, self._ident.model, out, usage)

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> CompletionChunk:
        i = self._ident
        return CompletionChunk(i.id, "text_completion", i.created, i.model, choices, usage)

    def _lp(self, index: int, delta: ChoiceDelta) -> CompletionLogprobs | None:
        if self._logprobs is None:
            return None
        items = delta.logprobs or []
        lp, self._offsets[index] = completion_logprobs(
            self._tokenizer, items, self._offsets.get(index, 0), self._logprobs > 0)
        return lp


class ChatFormatter:
    """`tool_calls`: parse tool calls out of the text (tools were offered), per service/openai/tool_calls.py, keeping
    at most `max_calls` (parallel_tool_calls false: 1)."""

    def __init__(self, ident: Identity, tokenizer: Tokenizer, logprobs: bool, tool_calls: bool = False,
                 max_calls: int | None = None) -> None:
        self._ident = ident
        self._tokenizer = tokenizer
        self._logprobs = logprobs
        self._encode = msgspec.json.Encoder().encode
        self._parsers: dict[int, ToolCallParser] | None = {} if tool_calls else None
        self._max_calls = max_calls

    def preamble(self, num_choices: int, usage: Usage | None = None) -> bytes:
        """OpenAI opens each choice with a role-only delta."""
        first = ChatDelta(role="assistant", content="")
        return b"".join(sse(self._encode(self._chunk([ChatChunkChoice(i, first, None, None)], usage)))
                        for i in range(num_choices))

    def chunk(self, index: int, delta: ChoiceDelta, usage: Usage | None = None) -> bytes:
        if self._parsers is not None:
            parser = self._parsers.setdefault(index, ToolCallParser(self._max_calls))
            return self._tool_chunk(parser, index, delta, usage)
        choice = ChatChunkChoice(index, ChatDelta(content=delta.text or None), self._lp(delta),
                                 delta.finish_reason)
        return sse(self._encode(self._chunk([choice], usage)))

    def _tool_chunk(self, parser: ToolCallParser, index: int, delta: ChoiceDelta, usage: Usage | None) -> bytes:
        content, calls = parser.feed(delta.text)
        if delta.finish_reason is not None:
            rest, more = parser.finish()
            content, calls = content + rest, calls + more
        elif not content and not calls and not delta.logprobs and usage is None:
            return b""  # all held back (a tag or arguments arriving)
        reason = _reason(delta.finish_reason, bool(parser.calls))
        out = ChatDelta(content=content or None, tool_calls=[_call_delta(c) for c in calls] or None)
        return sse(self._encode(self._chunk([ChatChunkChoice(index, out, self._lp(delta), reason)], usage)))

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse(self._encode(self._chunk([], usage)))

    def response(self, choices: list[ChoiceDelta], usage: Usage) -> ChatCompletion:
        out = [self._choice(i, d) for i, d in enumerate(choices)]
        return ChatCompletion(self._ident.id, "chat.completion", self._ident.created, self._ident.model, out,
                              usage)

    def _choice(self, index: int, delta: ChoiceDelta) -> ChatChoice:
        if self._parsers is None:
            return ChatChoice(index, AssistantMessage("assistant", delta.text), self._lp(delta), delta.finish_reason)
        content, calls = parse_tool_calls(delta.text, self._max_calls)
        message = AssistantMessage("assistant", content or (None if calls else ""),
                                   [ToolCallOut(c.id, "function", FunctionCallOut(c.name, c.arguments))
                                    for c in calls] or None)
        return ChatChoice(index, message, self._lp(delta), _reason(delta.finish_reason, bool(calls)))

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatChunk:
        i = self._ident
        return ChatChunk(i.id, "chat.completion.chunk", i.created, i.model, choices, usage)

    def _lp(self, delta: ChoiceDelta) -> ChatLogprobs | None:
        return chat_logprobs(self._tokenizer, delta.logprobs or []) if self._logprobs else None


def _reason(finish_reason: str | None, called: bool) -> str | None:
    """OpenAI's "tool_calls" for an answer that ended by itself after calling tools."""
    return "tool_calls" if called and finish_reason == "stop" else finish_reason


def _call_delta(delta: CallDelta) -> ToolCallDelta:
    if delta.id is not None:
        return ToolCallDelta(delta.index, delta.id, "function", FunctionDelta(delta.name, delta.arguments))
    return ToolCallDelta(delta.index, function=FunctionDelta(arguments=delta.arguments))
