"""What a chat request can cost, bounded before it is rendered.

Rendering a conversation through its Jinja template and tokenizing it is Python work proportional to the
request (a chat of thousands of messages or tools takes hundreds of milliseconds), and it holds the GIL on
whatever thread runs it. So before any of that, a chat body is measured (`check_shape`): how many messages and
tools it holds and how many bytes its tool definitions take (from a shallow decode that builds no objects for
them), then the least number of tokens its turns can render to against the context. Once decoded, the
messages' text is added to that bound (`check_length`); only a request that passes both is rendered.

The bound (`PromptBound`) is measured once per template at start-up (`measure`), from the tokens of
conversations of empty user and assistant turns: the fewest special tokens one more turn adds (the markers
around a message, `<|im_start|>` and `<|im_end|>` for SmolLM2) and the fewest runs of plain text between them
(SmolLM2's `user\n` and `\n`). A message's text may merge into those runs' tokens, but a run stays at least one
token. And whether the template renders a message's text as given (no trimming, no dropped reasoning): only
then does the text count, at least its bytes / the longest token's bytes in tokens, since no token spans more
bytes. So a conversation has at least specials + max(runs, text) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from backends.model.chat_template import ChatTemplate
from backends.model.tokenizer import Tokenizer
from service.openai.errors import bad_request
from service.openai.prompts import tokens_at_least, too_long
from service.openai.schemas.requests import ChatMessage

TURN_ROLES = ("user", "assistant")  # the roles `measure` renders
ROLES_RAW = {f'"{role}"'.encode(): role for role in TURN_ROLES}
_PROBE = " \n probe: <think>a</think> b \n "  # text a trimming or reasoning-dropping template would change


@dataclass(frozen=True)
class ChatLimits:
    """What a chat request may hold (service.max_messages, max_tools, max_tool_bytes)."""

    max_messages: int
    max_tools: int
    max_tool_bytes: int


@dataclass(frozen=True)
class PromptBound:
    specials: int = 0  # special tokens one more user or assistant turn adds, at least
    runs: int = 0  # runs of plain text between them it adds, at least
    counts_text: bool = False  # the template renders messages' text verbatim

    def at_least(self, roles: Sequence[object], text_tokens: int = 0) -> int:
        turns = sum(1 for role in roles if role in TURN_ROLES)
        return self.specials * turns + max(self.runs * turns, text_tokens if self.counts_text else 0)


@dataclass(frozen=True)
class Context:
    """What the shape's length bound needs: the template's (`measure`), and the context."""

    bound: PromptBound
    max_model_len: int


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


def measure(template: ChatTemplate, tokenizer: Tokenizer) -> PromptBound:
    """The template's bound; no bound (zeros) for a template that will not render the probes."""
    try:
        counts = [_specials_and_runs(tokenizer, template.render(_turns(count, ""), add_generation_prompt=False))
                  for count in (1, 2, 3)]
        rendered = template.render(_turns(2, _PROBE), add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any template failure: no bound, not a failed start
        return PromptBound()
    specials, runs = (max(0, min(counts[1][i] - counts[0][i], counts[2][i] - counts[1][i])) for i in (0, 1))
    return PromptBound(specials, runs, rendered.count(_PROBE) == 2)


def check_length(messages: Sequence[ChatMessage], bound: PromptBound, tokenizer: Tokenizer,
                 max_model_len: int) -> None:
    """400 context_length_exceeded for messages that cannot fit the context whatever their tokens."""
    at_least = bound.at_least([m.role for m in messages], tokens_at_least(message_bytes(messages), tokenizer))
    if at_least >= max_model_len:
        raise too_long(at_least, max_model_len, "messages")


def _specials_and_runs(tokenizer: Tokenizer, text: str) -> tuple[int, int]:
    """How many special tokens the text has, and how many runs of other tokens lie between them."""
    special = [token in tokenizer.special_ids for token in tokenizer.encode(text)]
    runs = sum(1 for i, is_special in enumerate(special) if not is_special and (i == 0 or special[i - 1]))
    return sum(special), runs


def _turns(count: int, content: str) -> list[dict[str, str]]:
    return [{"role": TURN_ROLES[i % 2], "content": content} for i in range(count)]


def message_bytes(messages: Sequence[ChatMessage]) -> int:
    """UTF-8 bytes of the messages' text (a lone surrogate counted as its three bytes)."""
    return sum(len(text.encode("utf-8", errors="surrogatepass")) for m in messages for text in _texts(m.content))


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [part.text or "" for part in content or ()]
