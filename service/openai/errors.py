"""Errors the HTTP layer answers with, in OpenAI's JSON shape, and the mapping from engine errors."""

from __future__ import annotations

import math

import msgspec
from aiohttp import web

from scheduler.errors import (
    ENGINE_FAILED,
    GRAMMAR_FAILED,
    KV_CACHE_EXHAUSTED,
    EngineStoppedError,
    GrammarError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    SchedulerError,
)
from service.openai.schemas.errors import ErrorBody, ErrorInfo

INVALID = "invalid_request_error"
JSON_CONTENT = "application/json"
RETRY_AFTER_S = 5  # what a 503 while loading, draining or failed asks clients to wait


class APIError(Exception):
    """Raised anywhere while handling a request; the error middleware turns it into the response."""

    def __init__(self, status: int, message: str, type_: str = INVALID, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, close: bool = False,
                 detail: str | None = None) -> None:
        """close: end the connection after the response (the request's bytes can no longer be trusted);
        detail: what the server log says beside the answer (a library's own words, never sent)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.close = close
        self.detail = detail

    def info(self) -> ErrorInfo:
        return ErrorInfo(self.message, self.type, self.param, self.code)

    def response(self) -> web.Response:
        body = msgspec.json.encode(ErrorBody(self.info()))
        resp = web.Response(status=self.status, body=body, content_type=JSON_CONTENT, headers=self.headers)
        if self.close:
            resp.force_close()
        return resp


def printable(text: str) -> str:
    """Text from the client's headers, safe to echo: undecodable bytes arrive as lone surrogates, which no JSON
    encoder accepts."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, INVALID, param, code)


def unavailable(message: str, code: str, retry_after: float | None = None) -> APIError:
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return APIError(503, message, "service_unavailable", None, code, headers)


def shutting_down() -> APIError:
    return unavailable("the server is shutting down", "shutting_down", retry_after=RETRY_AFTER_S)


def engine_failed(cause: str | None) -> APIError:
    return unavailable(f"the engine failed and the server is restarting: {cause}", ENGINE_FAILED,
                       retry_after=RETRY_AFTER_S)


def server_error(message: str, code: str = "internal_error") -> APIError:
    return APIError(500, message, "server_error", None, code)


def from_engine(exc: SchedulerError) -> APIError:
    """The HTTP face of an error the engine raised at submit."""
    if isinstance(exc, QueueFullError):
        return unavailable(f"the server is overloaded: {exc}", "queue_full", exc.retry_after)
    if isinstance(exc, EngineStoppedError):
        return shutting_down()
    if isinstance(exc, GrammarError):
        return APIError(400, str(exc), INVALID, exc.param, detail=exc.detail)
    if isinstance(exc, PromptTooLongError):
        return bad_request(str(exc), exc.param or "prompt", "context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc), exc.param)
    return server_error(str(exc))


def timed_out(seconds: float) -> APIError:
    return APIError(504, f"the request did not finish within {seconds:g} s", "timeout_error",
                    code="request_timeout")


def engine_failure(accepting: bool, message: str, code: str | None = None) -> APIError:
    """A request the engine ended with an error: cut short by the engine failing or by shutdown (503: retry
    elsewhere), preempted too often because the KV cache is too small for the load (503: retry later), or a
    failure of its own step (500); a grammar that broke mid-answer is the request's own fault (400)."""
    if code == ENGINE_FAILED:
        return unavailable(f"the request was cut short: {message}", ENGINE_FAILED, retry_after=RETRY_AFTER_S)
    if not accepting:
        return unavailable(f"the request was cut short: {message}", "shutting_down")
    if code == KV_CACHE_EXHAUSTED:
        return unavailable(message, KV_CACHE_EXHAUSTED, retry_after=1)
    if code == GRAMMAR_FAILED:  # the request's own grammar, past a matcher limit: the client's to change
        return bad_request(message, None, GRAMMAR_FAILED)
    return server_error(f"generation failed: {message}", "engine_error")
