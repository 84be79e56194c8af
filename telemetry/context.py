"""What the service hands the engine in `EngineRequest.trace_context`: the incoming W3C trace context plus the
request facts the engine does not know (served model name, OpenAI operation, optionally the prompt and the
tokenizer's decode for the completion)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


@dataclass(frozen=True)
class RequestContext:
    parent: Context  # empty when the request carried no (valid) traceparent: the span starts a new trace
    model: str | None = None
    operation: str = "chat"  # gen_ai.operation.name: "chat" | "text_completion"
    prompt: str | None = None  # recorded only when TelemetryConfig.record_content is on
    # Set with `prompt`: spells the completion's token ids as text, on the telemetry worker at the request's end
    decode: Callable[[Sequence[int]], str] | None = None
    request_id: str | None = None  # the HTTP request's X-Request-Id (the client's or the server's)
    # The request span's ids, reserved when the request arrives (Telemetry.reserve): the span itself is made
    # later, on the telemetry worker, but the response's traceresponse header must name it before that.
    span: SpanContext | None = None


def extract_context(headers: Mapping[str, str], *, model: str | None = None, operation: str = "chat",
                    prompt: str | None = None) -> RequestContext:
    """Read `traceparent` / `tracestate` from HTTP headers (any letter case) for EngineRequest.trace_context."""
    carrier = {key.lower(): value for key, value in headers.items()
               if key.lower() in ("traceparent", "tracestate")}
    return RequestContext(TraceContextTextMapPropagator().extract(carrier), model, operation, prompt)


def traceresponse(context: RequestContext) -> str | None:
    """The W3C `traceresponse` header naming the reserved request span; None when no span was reserved."""
    span = context.span
    if span is None:
        return None
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"


def as_request_context(value: Any) -> RequestContext:
    """Whatever the engine passed along: a RequestContext, a bare OTel Context, raw headers, or nothing."""
    if isinstance(value, RequestContext):
        return value
    if isinstance(value, Context):
        return RequestContext(value)
    if isinstance(value, Mapping):
        return extract_context(value)
    return RequestContext(Context())
