"""Traces: a TracerProvider of our own (never the process-global one) and the tracker sink that turns the engine's
records into spans with explicit start/end times.

Per request: `llm.request` (SERVER, child of the incoming traceparent) with children `llm.request.queue` (each
wait, a requeue after a preemption included), `llm.request.prefill` (each chunk) and `llm.request.decode`;
per-token events on the request span; a `slow_token` event for each attributed slow token. Per engine step:
`llm.engine_step`, linked to the request spans it served. With content recorded, the request span carries its
prompt and each choice's completion, as gen_ai.content.* events and as OpenInference input/output values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from telemetry.config import TelemetryConfig
from telemetry.interface import RequestRecord, StepRecord, TokenRecord
from telemetry.itl import SlowToken
from telemetry.spans import (
    COMPLETION_EVENT,
    DECODE_SPAN,
    PREEMPTED_EVENT,
    PREFILL_SPAN,
    PROMPT_EVENT,
    QUEUE_SPAN,
    REQUEST_SPAN,
    SLOW_TOKEN_EVENT,
    STEP_SPAN,
    TOKEN_EVENT,
    finish_attributes,
    input_attributes,
    output_attributes,
    request_attributes,
    slow_token_attributes,
    step_attributes,
    token_attributes,
)
from telemetry.tracker import RequestState

SCOPE = "pagedserve.telemetry"


class ReservedIds(RandomIdGenerator):
    """Random ids, except while a request span whose ids were reserved at arrival is being started: then
    those (the response's traceresponse header already named them). Used on the worker thread only."""

    def __init__(self) -> None:
        self.pending: SpanContext | None = None

    def generate_span_id(self) -> int:
        return self.pending.span_id if self.pending is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        return self.pending.trace_id if self.pending is not None else super().generate_trace_id()


def build_provider(config: TelemetryConfig, ids: ReservedIds | None = None) -> TracerProvider:
    """openinference.project.name: the project OpenInference stores (Phoenix) file the spans under."""
    limits = SpanLimits(max_events=config.max_span_events, max_links=config.max_span_links,
                        max_span_attributes=config.max_span_attributes,
                        max_event_attributes=config.max_span_attributes,
                        max_link_attributes=config.max_span_attributes)
    resource = Resource.create({"service.name": config.service_name,
                                "openinference.project.name": config.service_name})
    return TracerProvider(resource=resource, span_limits=limits,
                          id_generator=ids, shutdown_on_exit=False)


class EpochClock:
    """Engine-clock seconds -> epoch nanoseconds, with one offset taken once."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.offset_ns = time.time_ns() - int(clock() * 1e9)

    def ns(self, t: float) -> int:
        return self.offset_ns + int(t * 1e9)


@dataclass
class RequestSpans:
    span: trace.Span
    context: Context  # the request span as parent of its children


class TraceSink:
    def __init__(self, tracer: trace.Tracer, config: TelemetryConfig, clock: EpochClock,
                 overloaded: Callable[[], bool] = lambda: False, on_skip: Callable[[int], None] = lambda n: None,
                 ids: ReservedIds | None = None) -> None:
        """overloaded(): the worker is falling behind the engine, so per-token events are skipped (and counted
        with on_skip) until it catches up; everything else is still recorded."""
        self.tracer = tracer
        self.clock = clock
        self.overloaded = overloaded
        self.on_skip = on_skip
        self.model = config.model
        self.interval = config.token_event_interval
        self.step_spans = config.step_spans
        self.record_content = config.record_content
        self.open: dict[str, RequestSpans] = {}
        self.ids = ids or ReservedIds()

    def queued(self, state: RequestState) -> None:
        self.ids.pending = state.context.span
        try:
            span = self.tracer.start_span(REQUEST_SPAN, context=state.context.parent, kind=SpanKind.SERVER,
                                          attributes=request_attributes(state, self.model),
                                          start_time=self.clock.ns(state.queued_at))
        finally:
            self.ids.pending = None
        self.open[state.request_id] = RequestSpans(span, trace.set_span_in_context(span))
        if self.record_content and state.context.prompt is not None:
            span.add_event(PROMPT_EVENT, {"gen_ai.prompt": state.context.prompt}, self.clock.ns(state.queued_at))
            span.set_attributes(input_attributes(state.context.prompt))

    def preempted(self, state: RequestState, now: float) -> None:
        spans = self.open.get(state.request_id)
        if spans is not None:
            spans.span.add_event(PREEMPTED_EVENT, {"pagedserve.preemptions": state.preemptions},
                                 self.clock.ns(now))

    def wait_ended(self, state: RequestState, start: float, end: float) -> None:
        self._child(state, QUEUE_SPAN, start, end, {"pagedserve.requeue": state.requeued})

    def prefill_chunk(self, state: RequestState, step: StepRecord, tokens: int) -> None:
        self._child(state, PREFILL_SPAN, step.start, step.end, {
            "pagedserve.prefill.chunk": state.chunks - 1, "pagedserve.prefill.tokens": tokens,
            "pagedserve.prefill.recompute": state.requeued, "pagedserve.step.id": step.step_id,
            "pagedserve.step.batch_size": step.num_seqs, "pagedserve.step.prefill_tokens": step.prefill_tokens})

    def tokens(self, state: RequestState, step: StepRecord, record: TokenRecord, first_index: int, gap: float,
               slow: SlowToken | None) -> None:
        spans = self.open.get(state.request_id)
        if spans is None:
            return
        at = self.clock.ns(record.time)
        interval = self.interval
        if interval and self.overloaded():
            self.on_skip(len(range(-first_index % interval, record.num_tokens, interval)))
        elif interval:
            for index in range(first_index, first_index + record.num_tokens):
                if index % interval == 0:
                    spans.span.add_event(TOKEN_EVENT, token_attributes(index, step, record, gap, slow), at)
        if slow is not None:
            spans.span.add_event(SLOW_TOKEN_EVENT, slow_token_attributes(first_index, step, slow), at)

    def step(self, step: StepRecord, tokens: int) -> None:
        if not self.step_spans:
            return
        served = [spans.span.get_span_context() for rid in step.request_ids
                  if (spans := self.open.get(rid)) is not None]
        span = self.tracer.start_span(STEP_SPAN, context=Context(), kind=SpanKind.INTERNAL,
                                      links=[Link(served_span) for served_span in served],
                                      attributes=step_attributes(step, tokens, [c.span_id for c in served]),
                                      start_time=self.clock.ns(step.start))
        span.end(self.clock.ns(step.end))

    def finished(self, state: RequestState, record: RequestRecord) -> None:
        spans = self.open.pop(state.request_id, None)
        if spans is None:
            return
        if state.first_token is not None and state.last_token is not None:
            self._child(state, DECODE_SPAN, state.first_token, state.last_token,
                        {"gen_ai.usage.output_tokens": record.completion_tokens}, spans)
        spans.span.set_attributes(finish_attributes(state, record))
        self._completions(state, record, spans.span)
        if record.error is not None:
            spans.span.set_status(Status(StatusCode.ERROR, record.error))
        spans.span.end(self.clock.ns(max(record.finished, state.queued_at)))

    def rejected(self, reason: str) -> None:
        pass

    def _completions(self, state: RequestState, record: RequestRecord, span: trace.Span) -> None:
        """Each choice's output tokens spelled by the service's tokenizer, here on the worker, never the engine."""
        decode = state.context.decode
        if not self.record_content or decode is None or not record.token_ids:
            return
        texts = [decode(ids[record.prompt_tokens:]) for ids in record.token_ids]
        at = self.clock.ns(max(record.finished, state.queued_at))
        for index, text in enumerate(texts):
            span.add_event(COMPLETION_EVENT, {"gen_ai.completion": text, "pagedserve.choice.index": index}, at)
        span.set_attributes(output_attributes(texts))

    def _child(self, state: RequestState, name: str, start: float, end: float, attributes: dict[str, object],
               spans: RequestSpans | None = None) -> None:
        spans = spans or self.open.get(state.request_id)
        if spans is None:
            return
        child = self.tracer.start_span(name, context=spans.context, kind=SpanKind.INTERNAL,
                                       attributes=attributes,  # type: ignore[arg-type]
                                       start_time=self.clock.ns(start))
        child.end(self.clock.ns(max(end, start)))
