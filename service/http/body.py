"""Read a request body into a Struct: JSON only and uncompressed (415), size limit (413), arrival within the
read timeout (408), nesting depth, UTF-8 and JSON syntax (400), field types (400).

The nesting is measured without parsing: the JSON decoder recurses once per level of arrays and objects, also
inside fields typed `Any` (`tools`, `tool_choice`, `tool_calls`), so a body of 100,000 `[` would end in a
RecursionError. Measuring first lets such a body be refused with a 400 before it reaches the decoder."""

from __future__ import annotations

import asyncio
import re
from typing import TypeVar

import msgspec
import numpy as np
from aiohttp import web

from scheduler.errors import echoed
from service.config.settings import ServiceConfig
from service.http.surrogates import find_lone_surrogate
from service.openai.errors import APIError, bad_request, printable

T = TypeVar("T")
MAX_JSON_DEPTH = 128  # far deeper than any real request (a tool's JSON schema included), far below recursion
_PATH = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")
_AT = re.compile(r" - at `\$[^`]*`\Z")
_QUOTED = re.compile(r"([`'])(.*)\1", re.DOTALL)  # from the first quote to the last of its kind: the client's text
# A string, from its opening quote to its closing one, or to the end of the text when unterminated (that
# text is invalid anyway). Matching the leftmost quote never fails, so the scan stays linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
# Per byte outside strings: +1 for [ and {, -1 (as int8) for ] and }, 0 for anything else.
_STEP = bytes(1 if b in b"[{" else 255 if b in b"]}" else 0 for b in range(256))


async def read_json(request: web.Request, type_: type[T], service: ServiceConfig) -> T:
    return parse_json(await read_body(request, service.max_body_bytes, service.read_timeout_s), type_)


def parse_json(body: bytes, type_: type[T]) -> T:
    """The body's nesting checked, then decoded into `type_` (400s both)."""
    if exceeds_depth(body, MAX_JSON_DEPTH):
        raise too_deep()
    return decode(body, type_)


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    check_content(request)
    if request.content_length is not None and request.content_length > limit:
        raise too_large(request.content_length, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(None, limit) from None
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout",
                       close=True) from None
    except web.RequestPayloadError as exc:
        reason = " ".join(str(exc).split())
        raise bad_request(f"the request body could not be read: {reason}", code="malformed_request") from None


def check_content(request: web.Request) -> None:
    """A JSON body (a missing Content-Type is taken as JSON) and an uncompressed one: compressed bodies are
    refused rather than inflated, so no decompression bomb can cost memory or time."""
    if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        raise APIError(415, "compressed request bodies are not supported: send the body without Content-Encoding",
                       code="unsupported_content_encoding")
    if "Content-Type" in request.headers and request.content_type.lower() != "application/json":
        raise APIError(415, f"the request body must be JSON (Content-Type: application/json), not "
                       f"{echoed(printable(request.content_type))}", code="unsupported_media_type")


def too_deep() -> APIError:
    return bad_request(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", code="nesting_too_deep")


def too_large(size: int | None, limit: int) -> APIError:
    got = f" (got {size} bytes)" if size is not None else ""
    return APIError(413, f"request body exceeds the limit of {limit} bytes{got}", code="request_too_large")


def decode(body: bytes, type_: type[T]) -> T:
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = _param(message)
        raise bad_request(f"invalid request: {_bounded(message)}", echoed(param) if param else None) from None
    except msgspec.DecodeError as exc:
        if "UTF-8" in str(exc):
            raise bad_request("the request body is not valid UTF-8", code="invalid_utf8") from None
        if lone := find_lone_surrogate(body):
            raise bad_request(f"{lone.field} contains a lone UTF-16 surrogate ({lone.surrogate}), which is not "
                              "valid text", lone.param, "invalid_text") from None
        raise bad_request(f"could not parse the JSON body of the request: {exc}", code="invalid_json") from None
    except RecursionError:  # not reached past exceeds_depth; kept so that no body can ever give a 500
        raise too_deep() from None


def _bounded(message: str) -> str:
    """msgspec's message with the client's string in it (an unknown field's name, an enum value) bounded; the
    path at its end names our fields, list indexes and `[...]` for a dict's keys, never the client's text."""
    found = _AT.search(message)
    head, path = (message[:found.start()], found.group()) if found else (message, "")
    return _QUOTED.sub(lambda m: m[1] + echoed(m[2]) + m[1], head, count=1) + path


def _param(message: str) -> str | None:
    """The field a msgspec validation message is about, in OpenAI's `param` style."""
    for pattern in (_UNKNOWN, _MISSING):
        found = pattern.search(message)
        if found:
            prefix = _PATH.search(message)
            return ".".join(p for p in ((prefix.group(1) if prefix else ""), found.group(1)) if p)
    found = _PATH.search(message)
    return found.group(1) or None if found else None


def exceeds_depth(text: bytes, limit: int) -> bool:
    if text.count(b"[") + text.count(b"{") <= limit:  # too few brackets to nest that deep: the common case
        return False
    return nesting_depth(text) > limit


def nesting_depth(text: bytes) -> int:
    """The deepest level of nesting in a JSON text (0 for a scalar), brackets inside strings not counted."""
    steps = np.frombuffer(_STRING.sub(b"", text).translate(_STEP), np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))
