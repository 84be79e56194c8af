"""Cheap checks that bound what a chat request can cost before it is rendered.

Rendering a conversation through its Jinja template and tokenizing it is Python work proportional to the
request (a chat of thousands of messages or tools takes hundreds of milliseconds), and it holds the GIL on
whatever thread runs it. So before any of that, a chat body is measured: how many messages and tools it holds
and how many bytes its tool definitions take (from a shallow decode that builds no objects for them), then the
least number of tokens its messages can render to against the context. Only a request that passes is decoded
in full and rendered, on the tokenizer threads.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from service.config.settings import ChatLimits, ServiceConfig
from service.generation.tokenize import PromptEncoder
from service.http.body import parse_json, read_body
from service.openai.errors import APIError, bad_request
from service.openai.prompt_bound import TURN_ROLES, PromptBound
from service.openai.prompts import too_long

T = TypeVar("T")
ROLES_RAW = {f'"{role}"'.encode(): role for role in TURN_ROLES}
REFUSAL_PACE = 20  # a refused body's answer waits this many times what counting it took (~1 ms a MB)


class _Turn(msgspec.Struct):
    """A message's role as raw JSON, its content and the rest skipped unread. Raw, as every field of the shape
    that is not a list: a value of any type is neither built (which a client could make costly) nor a reason to
    skip the counts (the full decode refuses it)."""

    role: msgspec.Raw = msgspec.Raw(b"null")


class _Shape(msgspec.Struct):
    """A chat body's lists, tools undecoded (msgspec.Raw: their bytes, no objects); the rest skipped."""

    messages: list[_Turn] | None = None
    tools: list[msgspec.Raw] | None = None
    truncate_prompt_tokens: msgspec.Raw = msgspec.Raw(b"null")


class _RawShape(msgspec.Struct):
    """The same lists as raw JSON, for a body whose lists hold the wrong items: read apart by `_items`."""

    messages: msgspec.Raw = msgspec.Raw(b"null")
    tools: msgspec.Raw = msgspec.Raw(b"null")
    truncate_prompt_tokens: msgspec.Raw = msgspec.Raw(b"null")


def _shape(body: bytes) -> _Shape | None:
    """One pass for a well-typed body; a list of the wrong items is still counted; None: not an object."""
    try:
        return msgspec.json.decode(body, type=_Shape)
    except msgspec.ValidationError:
        pass
    except (msgspec.DecodeError, RecursionError):
        return None
    try:
        raw = msgspec.json.decode(body, type=_RawShape)
    except (msgspec.DecodeError, RecursionError):
        return None
    return _Shape(_items(raw.messages, list[_Turn]), _items(raw.tools, list[msgspec.Raw]), raw.truncate_prompt_tokens)


def _items(raw: msgspec.Raw, type_: Any) -> list[Any]:
    """The list `raw` holds as `type_`, else as undecoded items, else nothing (not a list: the full decode
    refuses it)."""
    for items in (type_, list[msgspec.Raw]):
        try:
            return msgspec.json.decode(raw, type=items | None) or []
        except (msgspec.DecodeError, RecursionError):
            continue
    return []


@dataclass(frozen=True)
class Context:
    """What the shape's length bound needs: the template's (service/openai/prompt_bound.py), and the context."""

    bound: PromptBound
    max_model_len: int


async def read_chat_body(request: web.Request, service: ServiceConfig, encoder: PromptEncoder, type_: type[T],
                         context: Context | None = None) -> T:
    """A body with messages and tools: counted (against `context` too, when given) before it is decoded in full,
    off the loop when it is big."""
    body = await read_body(request, service.max_body_bytes, service.read_timeout_s)
    started = time.perf_counter()
    try:
        check_shape(body, service.chat_limits, context)
    except APIError:
        await pace_refusal(time.perf_counter() - started)
        raise
    return await encoder.run(len(body), parse_json, body, type_)


async def pace_refusal(spent_s: float) -> None:
    """A refused request cost the event loop `spent_s`; its sender waits REFUSAL_PACE times that for the answer,
    so a client posting such bodies back to back gets the loop a small share of the time, not all of it."""
    await asyncio.sleep(REFUSAL_PACE * spent_s)


def check_shape(body: bytes, limits: ChatLimits, context: Context | None = None) -> None:
    """400 when a chat body holds more messages or tools, or more bytes of tools, than the limits allow, or more
    turns than the context can hold. A body this shallow decode cannot read is left for the full decode, which
    says what is wrong with it."""
    shape = _shape(body)
    if shape is None:
        return
    messages, tools = shape.messages or [], shape.tools or []
    _check_counts(messages, tools, limits)
    if context is not None and bytes(shape.truncate_prompt_tokens) == b"null":
        _check_turns(messages, context)


def _check_turns(messages: list[Any], context: Context) -> None:
    """The turns' own markers alone (check_length adds their text, once decoded). A role spelled with escapes
    is not counted: the bound only gets lower."""
    roles = [ROLES_RAW.get(bytes(m.role)) for m in messages if isinstance(m, _Turn)]
    at_least = context.bound.at_least(roles)
    if at_least >= context.max_model_len:
        raise too_long(at_least, context.max_model_len, "messages")


def _check_counts(messages: list[Any], tools: list[Any], limits: ChatLimits) -> None:
    if len(messages) > limits.max_messages:
        raise bad_request(f"at most {limits.max_messages} messages are accepted in a request, not {len(messages)}",
                          "messages", "too_many_messages")
    if len(tools) > limits.max_tools:
        raise bad_request(f"at most {limits.max_tools} tools are accepted in a request, not {len(tools)}", "tools",
                          "too_many_tools")
    size = sum(len(tool) for tool in tools)
    if size > limits.max_tool_bytes:
        raise bad_request(f"the tool definitions take {size} bytes; at most {limits.max_tool_bytes} are accepted",
                          "tools", "tools_too_large")

