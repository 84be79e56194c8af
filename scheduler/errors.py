"""Typed errors the service maps to HTTP statuses."""

from __future__ import annotations

# RequestOutput.error_code of a request that failed because one of its sequences was preempted more than
# max_preemptions times: the KV cache is too small for the load, so retrying later can succeed (HTTP 503).
KV_CACHE_EXHAUSTED = "kv_cache_exhausted"
ENGINE_FAILED = "engine_failed"  # a request ended because the engine failed (it serves nothing more)
GRAMMAR_FAILED = "grammar_failed"  # a request's grammar broke mid-answer (a resource limit of the matcher: HTTP 400)
ECHO_LIMIT = 256  # characters of a client's string an error message repeats


def echoed(text: str, limit: int = ECHO_LIMIT) -> str:
    """A client's string as an error message repeats it: whole when short, else its start and its length, so
    that a 100 KB model name does not come back as a 100 KB error."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


class SchedulerError(Exception):
    """Base class; `message` is meant for the client."""


class InvalidRequestError(SchedulerError, ValueError):
    """A parameter is out of range (HTTP 400); `param` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class GrammarError(InvalidRequestError):
    """A constraint the grammar engine cannot compile (HTTP 400): the message in our words, the engine's own
    text in `detail`, for the log only."""

    def __init__(self, message: str, param: str | None, detail: str) -> None:
        super().__init__(message, param)
        self.detail = detail


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus the tokens asked for) does not fit the context (HTTP 400)."""


class QueueFullError(SchedulerError):
    """The waiting queue is at its bound (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineStoppedError(SchedulerError):
    """The engine is draining or stopped and admits nothing (HTTP 503)."""


class DuplicateRequestError(InvalidRequestError):
    """A request id already in flight."""
