"""A chat request's tools and tool_choice: checked, and turned into what the prompt, the grammar and the
answer's parser need.

- `none` (or no tools): nothing is offered; the text is plain content.
- `auto` (the default with tools): the tools are offered; tool calls in the text become `tool_calls`.
- `required` / a named function: a grammar makes the answer one or more calls (exactly one, or one call of
  that function, when parallel_tool_calls is false or a function is named) whose arguments follow the
  function's JSON Schema, so they always parse and validate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scheduler.errors import InvalidRequestError, echoed
from scheduler.guided import JSON_LAYOUT, GuideFactory, GuideSpec
from service.openai.errors import bad_request, from_engine
from service.openai.schemas.requests import ChatRequest, NamedToolChoice, Tool

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
DEFINITIONS = ("$defs", "definitions")


@dataclass(frozen=True)
class ToolUse:
    offered: list[Tool] | None  # the tools shown to the model (None: none)
    parse: bool  # whether tool calls are parsed out of the answer
    guide: GuideSpec | None  # the grammar that forces calls (required / named), else None


NO_TOOLS = ToolUse(None, False, None)


def tool_use(req: ChatRequest, guides: GuideFactory | None) -> ToolUse:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return NO_TOOLS
    _check_names(req.tools)
    if choice == "none":
        return NO_TOOLS
    if choice in (None, "auto"):
        return ToolUse(req.tools, True, None)
    forced = _forced(req.tools, choice)
    single = isinstance(choice, NamedToolChoice) or req.parallel_tool_calls is False
    return ToolUse(req.tools, True, _compile(guides, call_grammar(forced, single)))


def _check_names(tools: list[Tool]) -> None:
    names = [t.function.name for t in tools]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise bad_request(f"function names must be unique; repeated: {echoed(', '.join(repeated))}", "tools")


def _forced(tools: list[Tool], choice: Any) -> list[Tool]:
    if not isinstance(choice, NamedToolChoice):
        return tools
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise bad_request(f"tool_choice names function '{echoed(choice.function.name)}', which is not in tools",
                          "tool_choice")
    return named


def call_grammar(tools: list[Tool], single: bool) -> str:
    """Lark for the answer: `<tool_call>` blocks (one when `single`), each a call of one of `tools` whose
    arguments follow its schema."""
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    rules = [f"start: block{'' if single else ' (_NL block)*'}",
             f'block: "<tool_call>" _NL ({calls}) _NL "</tool_call>"', '_NL: "\\n"']
    rules += [f"call_{i}: %json {json.dumps(_call_schema(t))}" for i, t in enumerate(tools)]
    return "\n".join(rules)


def _call_schema(tool: Tool) -> dict[str, Any]:
    """The call object's schema; the parameters' definitions move to its root, where their `#/$defs/...`
    references (pydantic's nested models) point."""
    parameters = dict(tool.function.parameters) if tool.function.parameters is not None else EMPTY_PARAMETERS
    definitions = {key: parameters.pop(key) for key in DEFINITIONS if key in parameters}
    return {"type": "object", "properties": {"name": {"const": tool.function.name}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT,
            **definitions}


def _compile(guides: GuideFactory | None, lark: str) -> GuideSpec:
    if guides is None:
        raise bad_request("tool_choice 'required' or a named function needs constrained decoding, which is not "
                          "available on this server", "tool_choice", "unsupported_parameter")
    try:
        return guides.compile("lark", lark, "tools")
    except InvalidRequestError as exc:
        raise from_engine(exc) from None
