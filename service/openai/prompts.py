"""Turn a request's prompt or messages into token ids, and check them against the context length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.model.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from backends.model.tokenizer import Tokenizer
from scheduler.errors import echoed
from service.openai.errors import APIError, bad_request
from service.openai.schemas.requests import ChatMessage, ContentPart, Tool
from service.openai.tool_prompt import call_dicts, generic_messages, knows_tools, tool_dicts

TokenIds = tuple[int, ...]


def completion_prompts(prompt: str | list[Any], tokenizer: Tokenizer, max_model_len: int) -> list[TokenIds]:
    """OpenAI's four prompt forms: a string, a list of strings, a token list, a list of token lists."""
    if isinstance(prompt, str):
        return [_checked(_encode(prompt, tokenizer, max_model_len, "prompt", bos=True), tokenizer, "prompt")]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [_checked(prompt, tokenizer, "prompt")]
    if all(isinstance(p, str) for p in prompt):
        return [_checked(_encode(p, tokenizer, max_model_len, f"prompt[{i}]", bos=True), tokenizer, f"prompt[{i}]")
                for i, p in enumerate(prompt)]
    if all(isinstance(p, list) for p in prompt):
        return [_checked(p, tokenizer, f"prompt[{i}]") for i, p in enumerate(prompt)]
    raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of such "
                      "lists, not a mixture", "prompt")


def num_prompts(prompt: str | list[Any]) -> int:
    """How many prompts completion_prompts will make of `prompt` (a list of ints is one)."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return 1
    return len(prompt)


def _encode(text: str, tokenizer: Tokenizer, max_model_len: int, param: str, bos: bool = False) -> list[int]:
    """Token ids of `text`, refusing without tokenizing a text that cannot fit the context whatever its tokens
    are: no token is longer than max_token_bytes, so B bytes are at least B / max_token_bytes tokens. bos: a
    completion prompt, which starts with BOS where the model asks for one (a chat template writes its own)."""
    at_least = tokens_at_least(len(text.encode("utf-8", errors="surrogatepass")), tokenizer)
    if at_least >= max_model_len:
        raise too_long(at_least, max_model_len, param)
    return tokenizer.encode_prompt(text) if bos else tokenizer.encode(text)


def tokens_at_least(num_bytes: int, tokenizer: Tokenizer) -> int:
    """The fewest tokens `num_bytes` of text encode to: no token spans more than max_token_bytes."""
    return -(-num_bytes // tokenizer.max_token_bytes)


def too_long(at_least: int, max_model_len: int, param: str) -> APIError:
    """400 context_length_exceeded for a prompt known, before tokenizing it, to have at least `at_least` tokens."""
    return bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your prompt has at "
                       f"least {at_least} tokens, which leaves no room for a completion.", param,
                       "context_length_exceeded")


def _checked(ids: Sequence[int], tokenizer: Tokenizer, param: str) -> TokenIds:
    if not ids:
        raise bad_request("the prompt must contain at least one token", param)
    vocab = tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is out of range (vocabulary size {vocab})", param)
    return tuple(ids)


def chat_prompt(messages: list[ChatMessage], template: ChatTemplate, tokenizer: Tokenizer, max_model_len: int,
                add_generation_prompt: bool = True, tools: list[Tool] | None = None) -> TokenIds:
    """The conversation through the chat template; `tools` (None: none offered) as tool_prompt.py says."""
    if not messages:
        raise bad_request("messages must contain at least one message", "messages")
    check_tool_messages(messages)
    plain = [_plain(m, i) for i, m in enumerate(messages)]
    native = knows_tools(template)
    if not native:
        plain = generic_messages(plain, tools)
    try:
        text = template.render(plain, add_generation_prompt=add_generation_prompt,
                               tools=tool_dicts(tools) if tools and native else None)
    except NoChatTemplate as exc:
        raise bad_request(str(exc), "messages") from None
    except ChatTemplateError as exc:
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from None
    return _checked(_encode(text, tokenizer, max_model_len, "messages"), tokenizer, "messages")


def check_tool_messages(messages: Sequence[ChatMessage]) -> None:
    """OpenAI's rules for tool results: each `tool` message names, in tool_call_id, a call of the assistant
    message before its run of tool messages, and every such call gets its result before the next message and
    before the conversation ends."""
    unanswered: dict[str, None] = {}
    for i, message in enumerate(messages):
        if message.role == "tool":
            _check_tool_result(message, i, unanswered)
            continue
        if unanswered:
            raise _unanswered(unanswered, i)
        unanswered = dict.fromkeys(call.id for call in message.tool_calls or ())
    if unanswered:
        raise _unanswered(unanswered, len(messages))


def _check_tool_result(message: ChatMessage, index: int, unanswered: dict[str, None]) -> None:
    param = f"messages[{index}].tool_call_id"
    if message.tool_call_id is None:
        raise bad_request(f"messages[{index}] has role 'tool' but no tool_call_id: a tool message must name the "
                          "call it answers", param, "missing_tool_call_id")
    if message.tool_call_id not in unanswered:
        raise bad_request(f"messages[{index}] has role 'tool' but answers no call of the assistant message before "
                          f"it ({echoed(message.tool_call_id)} is not among its unanswered tool_calls)", param,
                          "invalid_tool_call_id")
    del unanswered[message.tool_call_id]


def _unanswered(calls: dict[str, None], index: int) -> APIError:
    """`index`: the message that came instead of a result (the messages' count: the conversation ended)."""
    names = ", ".join(echoed(call) for call in list(calls)[:8])
    return bad_request(f"an assistant message with tool_calls must be followed by a tool message for each call; "
                       f"before messages[{index}], these have none: {names}", f"messages[{index}]",
                       "missing_tool_result")


def _plain(message: ChatMessage, index: int) -> dict[str, Any]:
    # "developer" is OpenAI's newer name for the system role; model templates know only "system".
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _text(message.content, index)}
    if message.tool_calls:
        out["tool_calls"] = call_dicts(message.tool_calls)
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _text(content: str | list[ContentPart] | None, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"content part type '{part.type}' is not supported (text only)",
                              f"messages[{index}].content")
    return "\n".join(part.text or "" for part in content)


def check_context(prompts: list[TokenIds], max_tokens: int | None, max_model_len: int, param: str) -> None:
    """OpenAI's rule: the prompt plus the tokens asked for must fit the context (400 names both)."""
    for ids in prompts:
        if len(ids) >= max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{len(ids)} tokens, which leaves no room for a completion.", param, "context_length_exceeded")
        if max_tokens is not None and len(ids) + max_tokens > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the completion). "
                "Please reduce the prompt or max_tokens.", "max_tokens", "context_length_exceeded")


def encode_limit(max_model_len: int, keep: int | None) -> int:
    """The context length the text pre-check refuses at: none when the prompt is to be truncated (the body
    size limit bounds the tokenizing work)."""
    return max_model_len if keep is None else 2**62


def truncation(asked: int | None, max_model_len: int) -> int | None:
    """How many prompt tokens vLLM's truncate_prompt_tokens keeps: N, at most the context length (-1 and 0:
    the context length; the schema refuses less); None: all."""
    if asked is None:
        return None
    return max_model_len if asked <= 0 else min(asked, max_model_len)


def truncated(prompts: list[TokenIds], keep: int | None) -> list[TokenIds]:
    """The last `keep` tokens of each prompt."""
    return prompts if keep is None else [ids[-keep:] for ids in prompts]
