"""Tools, tool calls and tool results into what the chat template renders.

A template that knows tools (it reads `tools`) gets them, and the history's calls as OpenAI-style dicts with
parsed arguments (the Hugging Face convention). One that does not gets the generic format: the tools described
in the system message, earlier calls written into the assistant's text as `<tool_call>` blocks, and tool
results as user turns in `<tool_response>` blocks, the format service/openai/tool_calls.py parses back.
"""

from __future__ import annotations

import json
from typing import Any

from backends.model.chat_template import ChatTemplate
from service.openai.schemas.requests import Tool, ToolCall

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. The functions are described "
    "as JSON Schema within <tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\nTo call a function, reply with a "
    "JSON object holding its name and arguments within <tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n</tool_call>')


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": _function(t)} for t in tools]


def _function(tool: Tool) -> dict[str, Any]:
    f = tool.function
    out: dict[str, Any] = {"name": f.name}
    if f.description is not None:
        out["description"] = f.description
    out["parameters"] = f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
    return out


def call_dicts(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The history's calls for a template that knows tools: arguments parsed (left as text if not JSON)."""
    return [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                          "arguments": _parsed(c.function.arguments)}}
            for c in calls]


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def generic_messages(messages: list[dict[str, Any]], tools: list[Tool] | None) -> list[dict[str, Any]]:
    """The conversation in the generic format, for a template without tool support."""
    out = [_generic(m) for m in messages]
    if not tools:
        return out
    block = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(t) for t in tool_dicts(tools)))
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{block}"}, *out[1:]]
    return [{"role": "system", "content": block}, *out]


def _generic(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    calls = message.get("tool_calls")
    if not calls:
        return {"role": message["role"], "content": message["content"]}
    blocks = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    text = "\n".join(filter(None, [message["content"], *blocks]))
    return {"role": message["role"], "content": text}


def call_text(name: str, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'


def knows_tools(template: ChatTemplate) -> bool:
    """Whether the template renders tools itself (it reads the `tools` variable)."""
    return template.source is not None and "tools" in template.source
