"""Spans from the engine's records, checked with the SDK's in-memory exporter: names, hierarchy, gen_ai and
OpenInference attributes, per-token events and their sampling, step spans and their links, recorded content,
W3C trace context."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backends.model.loader import ModelFiles
from telemetry import Telemetry, TelemetryConfig, extract_context
from tests.telemetry.rig import Rig, make_rig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def traced(files: ModelFiles, config: TelemetryConfig | None = None, **rig: Any
           ) -> tuple[Rig, Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    cfg = config or TelemetryConfig(schedule_delay_s=0.05)

    def factory(clock: Callable[[], float]) -> Telemetry:
        return Telemetry(cfg, clock=clock, span_exporter=exporter)

    r, telemetry = make_rig(files, factory, **rig)
    return r, telemetry, exporter


def finish(telemetry: Telemetry, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert telemetry.flush()
    spans = list(exporter.get_finished_spans())
    telemetry.shutdown()
    return spans


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def request_span(spans: list[ReadableSpan], request_id: str) -> ReadableSpan:
    (span,) = [s for s in named(spans, "llm.request") if s.attributes["pagedserve.request.id"] == request_id]
    return span


def test_request_span_continues_traceparent_with_gen_ai_attributes(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(schedule_delay_s=0.05, model="fallback-model"))
    ctx = extract_context({"Traceparent": TRACEPARENT}, model="SmolLM2-135M-Instruct", operation="chat")
    rig.submit("r1", 20, 6, trace_context=ctx)
    rig.submit("r2", 20, 3, seed=1)  # no context: a new trace
    outs = rig.run()
    spans = finish(telemetry, exporter)
    span = request_span(spans, "r1")
    assert span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
    assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.request.temperature"] == 0.0
    assert a["gen_ai.request.top_p"] == 1.0
    assert a["gen_ai.usage.input_tokens"] == 20 and a["gen_ai.usage.output_tokens"] == 6
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    oi = dict(span.attributes or {})  # OpenInference's, read by LLM trace stores
    assert oi["openinference.span.kind"] == "LLM" and oi["llm.model_name"] == "SmolLM2-135M-Instruct"
    assert (oi["llm.token_count.prompt"], oi["llm.token_count.completion"], oi["llm.token_count.total"]) == (20, 6, 26)
    record = rig.tee.finished["r1"]
    assert a["pagedserve.ttft_s"] == pytest.approx(record.first_token - record.arrival)
    for key in ("pagedserve.queue_time_s", "pagedserve.prefill_time_s", "pagedserve.decode_time_s"):
        assert a[key] >= 0
    assert a["pagedserve.decode_time_s"] > 0
    other = request_span(spans, "r2")
    assert other.attributes["gen_ai.request.model"] == "fallback-model"
    assert other.context.trace_id != span.context.trace_id and other.parent is None
    assert len(outs["r1"].choices[0].token_ids) == 6


def test_children_queue_prefill_chunks_decode(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, max_num_batched_tokens=64)
    rig.submit("long", 150, 4)  # 150 prompt tokens in chunks of 64: 3 prefill spans
    rig.run()
    spans = finish(telemetry, exporter)
    parent = request_span(spans, "long")
    children = [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
    names = [s.name for s in sorted(children, key=lambda s: s.start_time or 0)]
    assert names == ["llm.request.queue", "llm.request.prefill", "llm.request.prefill", "llm.request.prefill",
                     "llm.request.decode"]
    chunks = sorted(named(children, "llm.request.prefill"), key=lambda s: s.start_time or 0)
    assert [c.attributes["pagedserve.prefill.tokens"] for c in chunks] == [64, 64, 22]
    assert [c.attributes["pagedserve.prefill.chunk"] for c in chunks] == [0, 1, 2]
    assert parent.attributes["pagedserve.prefill_chunks"] == 3
    for child in children:
        assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time  # type: ignore[operator]


@pytest.mark.parametrize(("token_events", "expected"), [("all", 23), ("every:5", 5), ("none", 0)])
def test_token_events_sampling(files: ModelFiles, token_events: str, expected: int) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(token_events=token_events, schedule_delay_s=0.05))
    rig.submit("r", 12, 23)
    rig.run()
    span = request_span(finish(telemetry, exporter), "r")
    events = [e for e in span.events if e.name == "token"]
    assert len(events) == expected
    indexes = [e.attributes["pagedserve.token.index"] for e in events]
    step = 1 if token_events == "all" else 5
    assert indexes == list(range(0, 23, step))[:expected]
    times = [e.timestamp for e in events]
    assert times == sorted(times) and len(set(times)) == len(times)  # one step per token, in order
    if events:
        first = events[0].attributes
        assert set(first) >= {"pagedserve.step.id", "pagedserve.token.gap_s", "pagedserve.step.batch_size",
                              "pagedserve.step.prefill_tokens"}
        assert span.start_time <= events[0].timestamp <= span.end_time  # type: ignore[operator]


def test_long_generation_keeps_every_event(files: ModelFiles) -> None:
    # the virtual clock makes 1500 steps at once: let the worker fall behind without skipping events
    rig, telemetry, exporter = traced(files, TelemetryConfig(schedule_delay_s=0.05, max_backlog=10**6),
                                      profile="h200")
    rig.submit("long", 8, 1500)
    rig.run()
    span = request_span(finish(telemetry, exporter), "long")
    assert len([e for e in span.events if e.name == "token"]) == 1500
    assert span.dropped_events == 0


def test_step_spans_link_the_requests_they_served(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files)
    for i in range(3):
        rig.submit(f"r{i}", 10 + i, 4, seed=i)
    rig.run()
    spans = finish(telemetry, exporter)
    requests = {s.context.span_id: s.attributes["pagedserve.request.id"] for s in named(spans, "llm.request")}
    steps = sorted(named(spans, "llm.engine_step"), key=lambda s: s.attributes["pagedserve.step.id"])
    assert len(steps) == len(rig.tee.steps)
    for span, record in zip(steps, rig.tee.steps, strict=True):
        linked = {requests[link.context.span_id] for link in span.links}
        assert linked == set(record.request_ids)
        spans_named = tuple(format(link.context.span_id, "016x") for link in span.links)
        assert dict(span.attributes or {})["pagedserve.step.request_spans"] == spans_named  # for link-less stores
        assert span.attributes["pagedserve.step.batch_size"] == record.num_seqs
        assert span.attributes["pagedserve.step.prefill_tokens"] == record.prefill_tokens
        assert span.attributes["pagedserve.step.decode_tokens"] == record.decode_tokens
        assert span.attributes["pagedserve.step.kv_usage"] == record.kv_usage
        assert span.parent is None
    assert steps[0].attributes["pagedserve.step.prefill_tokens"] == 33


def test_no_step_spans_when_off(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(step_spans=False, schedule_delay_s=0.05))
    rig.submit("r", 10, 3)
    rig.run()
    spans = finish(telemetry, exporter)
    assert not named(spans, "llm.engine_step") and named(spans, "llm.request")


def content_context(decoded: list[Sequence[int]], decode: Callable[[Sequence[int]], str]) -> Any:
    """A request context carrying a prompt and a decoder that notes what it was asked to decode."""
    def noting(ids: Sequence[int]) -> str:
        decoded.append(list(ids))
        return decode(ids)
    return replace(extract_context({}, prompt="secret prompt"), decode=noting)


def test_prompt_and_completion_recorded_only_when_enabled(files: ModelFiles) -> None:
    for record_content in (False, True):
        rig, telemetry, exporter = traced(files, TelemetryConfig(record_content=record_content,
                                                                  schedule_delay_s=0.05))
        decoded: list[Sequence[int]] = []
        rig.submit("r", 10, 2, trace_context=content_context(decoded, files.tokenizer.decode))
        output = rig.run()["r"].choices[0].token_ids
        span = request_span(finish(telemetry, exporter), "r")
        completion = files.tokenizer.decode(output)
        prompts = [e for e in span.events if e.name == "gen_ai.content.prompt"]
        completions = [e.attributes for e in span.events if e.name == "gen_ai.content.completion"]
        assert len(prompts) == int(record_content)
        assert decoded == ([list(output)] if record_content else [])  # off: not even decoded
        assert completions == ([{"gen_ai.completion": completion, "pagedserve.choice.index": 0}]
                               if record_content else [])
        recorded = {key: dict(span.attributes or {}).get(key) for key in ("input.value", "output.value")}
        assert recorded == ({"input.value": "secret prompt", "output.value": completion} if record_content
                            else {"input.value": None, "output.value": None})
        flat = repr(span.to_json())
        assert ("secret prompt" in flat) is record_content


def test_several_choices_give_a_json_array_of_completions(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(record_content=True, schedule_delay_s=0.05))
    rig.submit("r", 10, 3, trace_context=content_context([], files.tokenizer.decode), n=2)
    choices = rig.run()["r"].choices
    span = request_span(finish(telemetry, exporter), "r")
    attributes = dict(span.attributes or {})
    texts = [files.tokenizer.decode(choice.token_ids) for choice in sorted(choices, key=lambda c: c.index)]
    assert attributes["output.mime_type"] == "application/json"
    assert json.loads(str(attributes["output.value"])) == texts
    indices = [dict(e.attributes or {})["pagedserve.choice.index"] for e in span.events
               if e.name == "gen_ai.content.completion"]
    assert indices == [0, 1]


def test_aborted_request_ends_its_span(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files)
    rig.submit("queued", 10, 5)
    rig.core.abort("queued")  # never scheduled
    rig.submit("running", 10, 50, seed=1)
    rig.step()
    rig.step()
    rig.core.abort("running", "client went away")
    spans = finish(telemetry, exporter)
    queued, running = request_span(spans, "queued"), request_span(spans, "running")
    assert queued.attributes["gen_ai.response.finish_reasons"] == ("abort",)
    assert "pagedserve.ttft_s" not in queued.attributes
    assert running.status.status_code is StatusCode.ERROR and running.status.description == "client went away"
    assert running.attributes["gen_ai.usage.output_tokens"] == 2


def test_disabled_telemetry_does_nothing(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(enabled=False))
    rig.submit("r", 10, 3)
    rig.run()
    assert not telemetry.tracing and telemetry.flush()
    assert finish(telemetry, exporter) == []
    assert b"pagedserve:generation_tokens_total 0.0" in telemetry.render()


def test_extract_context_ignores_garbage() -> None:
    ctx = extract_context({"traceparent": "not-a-traceparent"})
    assert ctx.parent == {} and ctx.operation == "chat"


def test_worker_behind_skips_token_events_and_counts_them(files: ModelFiles) -> None:
    rig, telemetry, exporter = traced(files, TelemetryConfig(max_backlog=5, schedule_delay_s=0.05))
    held = threading.Event()
    worker = telemetry._worker
    assert worker is not None
    worker.put(held.wait, 10.0)  # hold the worker: the engine's records pile up behind it
    rig.submit("r", 10, 40)
    rig.run()
    held.set()
    spans = finish(telemetry, exporter)
    recorded = len([e for e in request_span(spans, "r").events if e.name == "token"])
    rendered = telemetry.render()
    skipped = float(re.findall(rb"^pagedserve:telemetry_token_events_skipped_total (\S+)", rendered, re.M)[0])
    assert skipped > 0 and recorded + skipped == 40
    assert named(spans, "llm.engine_step")  # everything but token events is still recorded
