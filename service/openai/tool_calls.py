"""Tool calls out of a model's text, as it streams: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The format is the one the tool prompt teaches (service/openai/tool_prompt.py) and the tool grammar enforces
(service/tool_grammar.py); it is also what Hermes-style templates (Qwen, Hermes, SmolLM3) use natively.

The parser turns text deltas into content deltas and OpenAI's tool-call deltas: a call's first delta carries
its id, type and name, the next ones pieces of its arguments, sent as they arrive. The arguments end where the
call object closes, so the text from the last `}` on is held back until the closing tag shows which `}` that was.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class CallDelta:
    """A piece of tool call number `index`: its id and name first (once), then argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass
class _Call:
    id: str
    name: str | None = None
    text: str = ""  # everything after the opening tag
    sent: int = 0  # argument characters already sent


@dataclass
class ToolCallParser:
    """`max_calls`: the calls kept (parallel_tool_calls false: 1); later ones are dropped, text and all."""

    max_calls: int | None = None
    calls: list[ParsedCall] = field(default_factory=list)
    _buffer: str = ""  # text not yet emitted outside calls (a partial opening tag)
    _call: _Call | None = None

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """(content to emit, tool-call deltas) for new text."""
        self._buffer += text
        content, deltas = "", list[CallDelta]()
        while True:
            if self._call is None:
                content += self._take_content()
                if self._call is None:
                    return content, deltas
            if not self._advance_call(deltas):
                return content, deltas

    def finish(self) -> tuple[str, list[CallDelta]]:
        """The end of the text: what was held back, and a call left open ends where the text does."""
        deltas: list[CallDelta] = []
        if self._call is not None:
            self._close_call(self._call.text + self._buffer, deltas)
            self._buffer = ""
            return "", deltas
        rest, self._buffer = self._buffer, ""
        return (rest if rest.strip() or not self.calls else ""), deltas

    def _take_content(self) -> str:
        start = self._buffer.find(OPEN)
        if start >= 0:
            content, self._buffer = self._buffer[:start], self._buffer[start + len(OPEN):]
            self._call = _Call(new_call_id())
            return content.rstrip()  # the space before a call is no content
        # Held back: a tag that may be arriving, and the space before it (space between calls is no content).
        keep = _partial_suffix(self._buffer, OPEN)
        before = self._buffer[: len(self._buffer) - keep]
        keep += len(before) - len(before.rstrip())
        content, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
        return content

    def _advance_call(self, deltas: list[CallDelta]) -> bool:
        """Move the open call on with the buffered text; True when it closed (text may follow)."""
        call = self._call
        assert call is not None
        call.text, self._buffer = call.text + self._buffer, ""
        end = _closing_tag(call.text)
        if end >= 0:
            self._buffer = call.text[end + len(CLOSE):]
            self._close_call(call.text[:end], deltas)
            return True
        self._stream_arguments(call, deltas)
        return False

    @property
    def _full(self) -> bool:
        return self.max_calls is not None and len(self.calls) >= self.max_calls

    def _stream_arguments(self, call: _Call, deltas: list[CallDelta]) -> None:
        head = _HEAD.match(call.text)
        if head is None or self._full:
            return
        if call.name is None:
            call.name = _unescape(head.group(1))
            deltas.append(CallDelta(len(self.calls), call.id, call.name))
        body = call.text[head.end():]
        brace = body.rfind("}")  # from the last brace on (and the space before it), the call object may be ending
        safe = len(body[:brace].rstrip()) if brace >= 0 else len(body)
        if safe > call.sent:
            deltas.append(CallDelta(len(self.calls), arguments=body[call.sent:safe]))
            call.sent = safe

    def _close_call(self, text: str, deltas: list[CallDelta]) -> None:
        call, self._call = self._call, None
        assert call is not None
        if self._full:
            return
        name, arguments = _name_and_arguments(text)
        if call.name is None:
            call.name = name
            deltas.append(CallDelta(len(self.calls), call.id, name))
        if len(arguments) > call.sent:
            deltas.append(CallDelta(len(self.calls), arguments=arguments[call.sent:]))
        self.calls.append(ParsedCall(call.id, call.name, arguments))


def _closing_tag(text: str) -> int:
    """Where the call's closing tag starts: the first one outside a JSON string (-1: none yet)."""
    end = text.find(CLOSE)
    while end >= 0 and not _outside_string(text[:end]):
        end = text.find(CLOSE, end + 1)
    return end


def _outside_string(text: str) -> bool:
    """Whether JSON text ends outside a string literal (its unescaped quotes are even)."""
    quotes, escaped = 0, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quotes += 1
    return quotes % 2 == 0


def _name_and_arguments(text: str) -> tuple[str, str]:
    """A closed call's name and argument text: from the JSON when it parses, else from its head."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        head = _HEAD.match(text)
        if head is not None and text.rstrip().endswith("}"):
            return obj["name"], text.rstrip()[head.end(): -1].rstrip()  # as the model wrote them
        return obj["name"], json.dumps(obj.get("arguments", {}))
    head = _HEAD.match(text)
    if head is None:
        return "", text.strip()
    body = text[head.end():].rstrip()
    return _unescape(head.group(1)), body[:-1].rstrip() if body.endswith("}") else body


def _unescape(quoted: str) -> str:
    try:
        return str(json.loads(f'"{quoted}"'))
    except json.JSONDecodeError:
        return quoted


def _partial_suffix(text: str, tag: str) -> int:
    """How many of text's last characters begin `tag` (held back: the tag may be arriving)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str, max_calls: int | None = None) -> tuple[str, list[ParsedCall]]:
    """The whole text at once: its content (outside calls) and its calls."""
    parser = ToolCallParser(max_calls)
    content, _ = parser.feed(text)
    rest, _ = parser.finish()
    return content + rest, parser.calls
