"""What an answer must look like: an error is exactly OpenAI's `{"error": {"message", "type", "param",
"code"}}` sent as application/json; a 200 is the route's response shape; an SSE stream is chunks (or an
in-band error in the same JSON) and ends with `data: [DONE]`. Each check returns its problems as text."""

from __future__ import annotations

from typing import Any

import msgspec

from bench.loadgen.sse import DONE, EventSplitter
from service.openai.schemas.responses import (
    ChatChunk,
    ChatCompletion,
    Completion,
    CompletionChunk,
    Health,
    ModelCard,
    ModelList,
)

ERROR_FIELDS = {"message", "type", "param", "code"}
JSON = "application/json"
SSE = "text/event-stream"
# The shape of a 200 by route: (whole body, one stream chunk).
SHAPES: dict[str, tuple[type[Any], type[Any] | None]] = {
    "POST /v1/completions": (Completion, CompletionChunk),
    "POST /v1/chat/completions": (ChatCompletion, ChatChunk),
    "GET /v1/models": (ModelList, None),
    "GET /v1/models/{model}": (ModelCard, None),
    "GET /health": (Health, None),
}


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def error_problems(content_type: str, body: bytes) -> list[str]:
    """Why an error answer is not OpenAI's error JSON ([] when it is)."""
    if media_type(content_type) != JSON:
        return [f"error sent as {content_type or 'no Content-Type'}"]
    try:
        return error_shape_problems(msgspec.json.decode(body))
    except msgspec.DecodeError:
        return ["error body is not JSON"]


def error_shape_problems(payload: Any) -> list[str]:
    if not isinstance(payload, dict) or set(payload) != {"error"} or not isinstance(payload["error"], dict):
        return ['error body is not {"error": {...}}']
    info = payload["error"]
    if set(info) != ERROR_FIELDS:
        return [f"error fields are {sorted(info)}, not {sorted(ERROR_FIELDS)}"]
    if not isinstance(info["message"], str) or not isinstance(info["type"], str):
        return ["error message or type is not a string"]
    if not all(info[k] is None or isinstance(info[k], str) for k in ("param", "code")):
        return ["error param or code is neither a string nor null"]
    return []


def success_problems(route: str, content_type: str, body: bytes) -> list[str]:
    """Why a 200 is not the route's response: a JSON body of its shape, or a well-formed SSE stream."""
    whole, chunk = SHAPES.get(route, (None, None))
    if media_type(content_type) == SSE:
        return stream_problems(body, chunk) if chunk is not None else [f"{route} answered with a stream"]
    if whole is None:
        return []
    if media_type(content_type) != JSON:
        return [f"200 sent as {content_type or 'no Content-Type'}"]
    return _decode_problems(body, whole, "body")


def stream_problems(body: bytes, chunk: type[Any]) -> list[str]:
    splitter = EventSplitter()
    events = splitter.feed(body)
    if splitter.buffer.strip():
        return ["the stream ends inside an event"]
    if not events or events[-1] != DONE:
        return ["the stream does not end with data: [DONE]"]
    problems = [p for event in events[:-1] for p in _event_problems(event, chunk)]
    return problems[:1]


def _event_problems(event: bytes, chunk: type[Any]) -> list[str]:
    if event == DONE:
        return ["data: [DONE] before the end of the stream"]
    try:
        payload = msgspec.json.decode(event)
    except msgspec.DecodeError:
        return ["an event is not JSON"]
    if isinstance(payload, dict) and "error" in payload:
        return [f"in-band {p}" for p in error_shape_problems(payload)]
    return _decode_problems(event, chunk, "chunk")


def _decode_problems(data: bytes, shape: type[Any], what: str) -> list[str]:
    try:
        msgspec.json.decode(data, type=shape)
    except msgspec.DecodeError as exc:
        return [f"{what} is not a {shape.__name__}: {exc}"]
    return []
