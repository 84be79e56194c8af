"""Server-Sent Events as OpenAI streams them: `data: {json}` events separated by blank lines, ending with
`data: [DONE]`. Only the fields a benchmark needs are decoded; everything else is skipped unread."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

DONE = b"[DONE]"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # completions
    delta: _Delta | None = None  # chat


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Error(msgspec.Struct):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: Usage | None = None
    error: _Error | str | None = None

    def content(self) -> str:
        """The first choice's new text ("" for role-only, finish-only and usage chunks)."""
        if not self.choices:
            return ""
        choice = self.choices[0]
        if choice.text is not None:
            return choice.text
        return (choice.delta.content or "") if choice.delta is not None else ""

    def error_kind(self) -> str | None:
        if self.error is None:
            return None
        if isinstance(self.error, str):
            return "stream error"
        return f"stream error: {self.error.code or self.error.type or 'unknown'}"


@dataclass
class EventSplitter:
    """Bytes in, complete `data:` payloads out (an event may arrive split across reads)."""

    buffer: bytes = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data.replace(b"\r\n", b"\n")
        *events, self.buffer = self.buffer.split(b"\n\n")
        return [payload for event in events if (payload := _payload(event)) is not None]


def _payload(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None  # comments (":...") and other fields carry no data


def chunk_decoder() -> msgspec.json.Decoder[Chunk]:
    return msgspec.json.Decoder(Chunk)
