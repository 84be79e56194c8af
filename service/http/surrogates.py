"""Where a body's lone UTF-16 surrogate is. JSON can spell one (`"\\ud800"` without its pair) but it is no text:
msgspec refuses the whole body ("Input data was truncated", "unexpected end of escaped utf-16 surrogate pair"),
naming neither the field nor the cause. Only after such a refusal, the standard library's parser (which keeps
lone surrogates) reads the body again to say which field holds one."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from scheduler.errors import echoed

_LONE = re.compile("[\ud800-\udfff]")  # after parsing, a pair is one character: any surrogate left is alone


@dataclass(frozen=True)
class LoneSurrogate:
    field: str  # the path, as `messages[0].content`, or "a field name [in <path>]"
    param: str | None
    surrogate: str  # as the client spelt it: \ud800


def find_lone_surrogate(body: bytes) -> LoneSurrogate | None:
    """The first string (value or field name, in document order) of `body` with a lone surrogate, if any."""
    try:
        root = json.loads(body)
    except (ValueError, RecursionError):  # not JSON after all (or deeper than any body read_json lets through)
        return None
    stack: list[tuple[str, str | int | None, Any]] = [("", None, root)]  # (parent's path, key or index, value)
    while stack:
        parent, step, value = stack.pop()
        if isinstance(step, str) and (found := _LONE.search(step)):
            where = f"a field name in {parent}" if parent else "a field name"
            return LoneSurrogate(where, parent or None, _spelt(found.group()))
        path = _path(parent, step)
        if isinstance(value, str) and (found := _LONE.search(value)):
            return LoneSurrogate(path, path, _spelt(found.group()))
        if isinstance(value, dict):
            stack += [(path, key, item) for key, item in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(path, i, item) for i, item in reversed(list(enumerate(value)))]
    return None


def _path(parent: str, step: str | int | None) -> str:
    if step is None:
        return parent
    if isinstance(step, int):
        return f"{parent}[{step}]"
    return f"{parent}.{echoed(step)}" if parent else echoed(step)


def _spelt(char: str) -> str:
    return f"\\u{ord(char):04x}"
