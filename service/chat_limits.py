"""Cheap checks that bound what a chat request can cost before it is rendered.

Rendering a conversation through its Jinja template and tokenizing it is Python work proportional to the
request (a chat of thousands of messages or tools takes hundreds of milliseconds), and it holds the GIL on
whatever thread runs it. So before any of that, a chat body is measured: how many messages and tools it holds
and how many bytes its tool definitions take (from a shallow decode that builds no objects for them), then the
least number of tokens its messages can render to against the context. Only a request that passes is decoded
in full and rendered, on the tokenizer threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec
from aiohttp import web

from backends.model.chat_template import ChatTemplate
from backends.model.tokenizer import Tokenizer
from service.body import MAX_JSON_DEPTH, decode, read_body, too_deep
from service.config import ChatLimits, ServiceConfig
from service.errors import bad_request
from service.json_depth import exceeds_depth
from service.schemas.requests import ChatMessage
from service.tokenize import PromptEncoder, message_bytes

T = TypeVar("T")


class _Shape(msgspec.Struct):
    """A chat body's lists, each element left undecoded (msgspec.Raw: its bytes, no objects); the rest skipped."""

    messages: list[msgspec.Raw] | None = None
    tools: list[msgspec.Raw] | None = None


async def read_chat_body(request: web.Request, service: ServiceConfig, encoder: PromptEncoder, type_: type[T]) -> T:
    """A body with messages and tools: counted before it is decoded in full (off the loop when it is big)."""
    body = await read_body(request, service.max_body_bytes, service.read_timeout_s)
    check_shape(body, service.chat_limits)
    return await encoder.run(len(body), parse, body, type_)


def check_shape(body: bytes, limits: ChatLimits) -> None:
    """400 when a chat body holds more messages or tools, or more bytes of tools, than the limits allow. A body
    this shallow decode cannot read is left for the full decode, which says what is wrong with it."""
    try:
        shape = msgspec.json.decode(body, type=_Shape)
    except (msgspec.DecodeError, RecursionError):
        return
    messages, tools = shape.messages or [], shape.tools or []
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


def parse(body: bytes, type_: type[T]) -> T:
    """The body's depth checked, then decoded into `type_` (on a tokenizer thread when the body is big)."""
    if exceeds_depth(body, MAX_JSON_DEPTH):
        raise too_deep()
    return decode(body, type_)


def check_length(messages: Sequence[ChatMessage], message_tokens: int, tokenizer: Tokenizer,
                 max_model_len: int) -> None:
    """400 context_length_exceeded, before rendering, for messages that cannot fit the context whatever their
    tokens: each renders to at least `message_tokens` tokens of the template's own, and its text of B bytes
    to at least B / max_token_bytes more."""
    text = -(-message_bytes(messages) // tokenizer.max_token_bytes)
    turns = sum(1 for m in messages if m.role in ("user", "assistant"))  # the roles message_tokens was measured on
    at_least = text + message_tokens * turns
    if at_least >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has at least "
            f"{at_least} tokens, which leaves no room for a completion.", "messages", "context_length_exceeded")


def tokens_per_message(template: ChatTemplate, tokenizer: Tokenizer) -> int:
    """The fewest tokens one more empty message adds to a rendered conversation, whatever its role (user or
    assistant, turn about): the template's markers around a message. 0 when the template will not say."""
    try:
        lengths = [len(tokenizer.encode(template.render(_turns(count), add_generation_prompt=False)))
                   for count in (1, 2, 3)]
    except Exception:  # noqa: BLE001 - a template that cannot render empty turns: no bound, not a failed start
        return 0
    return max(0, min(lengths[1] - lengths[0], lengths[2] - lengths[1]))


def _turns(count: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": ""} for i in range(count)]
