"""OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from msgspec import Struct


class ErrorInfo(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Struct):
    error: ErrorInfo
