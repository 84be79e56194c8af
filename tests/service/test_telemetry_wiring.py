"""Telemetry through the real server: an incoming traceparent is continued by the request span exported over
OTLP/HTTP, and /metrics carries the engine's latency histograms."""

from __future__ import annotations

import time
from dataclasses import replace

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig, TelemetrySettings
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, request
from tests.telemetry.receiver import OtlpReceiver, attrs

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _request_spans(receiver: OtlpReceiver, count: int = 1, deadline_s: float = 10.0) -> list[Span]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        spans = [s for s in receiver.spans if s.name == "llm.request"]
        if len(spans) >= count:
            return spans
        time.sleep(0.05)
    return []


def _traced_server(receiver: OtlpReceiver, model_files: ModelFiles, record_content: bool = False) -> LiveServer:
    settings = TelemetrySettings(otlp_endpoint=receiver.endpoint, record_content=record_content)
    return LiveServer.start(replace(sim_config(ServiceConfig(port=0)), telemetry=settings),
                            cached_builder(model_files))


def _flush(server: LiveServer) -> None:
    server.call(lambda: server.state.runtime.telemetry.flush(5.0))  # type: ignore[union-attr]


def _prompts(span: Span) -> list[str]:
    return [attrs(e.attributes)["gen_ai.prompt"] for e in span.events if e.name == "gen_ai.content.prompt"]


def test_traceparent_is_continued_and_metrics_are_served(model_files: ModelFiles) -> None:
    with OtlpReceiver() as receiver:
        server = _traced_server(receiver, model_files)
        try:
            body = {"prompt": "Hello there", "max_tokens": 5, "temperature": 0}
            assert post(f"{server.url}/v1/completions", body, {"traceparent": TRACEPARENT}).status == 200
            _flush(server)  # the engine's records reach the metrics on the telemetry worker's thread
            metrics = request("GET", f"{server.url}/metrics").body.decode()
            assert "pagedserve:time_to_first_token_seconds_count 1.0" in metrics
            assert "pagedserve:generation_tokens_total 5.0" in metrics
            spans = _request_spans(receiver)
        finally:
            server.close()
    assert len(spans) == 1
    span = spans[0]
    assert span.trace_id.hex() == TRACE_ID
    assert attrs(span.attributes)["gen_ai.usage.output_tokens"] == 5
    assert attrs(span.attributes)["gen_ai.operation.name"] == "text_completion"
    assert sum(1 for e in span.events if e.name == "token") == 5
    assert _prompts(span) == [] and "Hello there" not in str(span)  # record_content is off by default


def test_record_content_puts_each_prompt_in_its_request_span(model_files: ModelFiles) -> None:
    with OtlpReceiver() as receiver:
        server = _traced_server(receiver, model_files, record_content=True)
        try:
            chat = {"messages": [{"role": "user", "content": "secret chat"}], "max_tokens": 2}
            assert post(server.url + "/v1/chat/completions", chat).status == 200
            assert post(server.url + "/v1/completions", {"prompt": ["first", "second"], "max_tokens": 2}).status == 200
            _flush(server)
            spans = _request_spans(receiver, count=3)
        finally:
            server.close()
    by_operation = {(attrs(s.attributes)["gen_ai.operation.name"], tuple(_prompts(s))) for s in spans}
    chat_prompt = next(p[0] for op, p in by_operation if op == "chat")
    assert len(spans) == 3 and {p for op, p in by_operation if op == "text_completion"} == {("first",), ("second",)}
    assert "<|im_start|>user\nsecret chat" in chat_prompt  # as the model saw it, chat template applied


def test_the_recorded_completion_is_the_text_the_client_got(model_files: ModelFiles) -> None:
    """Cut at the stop string where the client's text was, not the tokens the engine decoded past it."""
    body = {"prompt": "Hello there", "max_tokens": 16, "temperature": 0}
    with OtlpReceiver() as receiver:
        server = _traced_server(receiver, model_files, record_content=True)
        try:
            whole = post(server.url + "/v1/completions", body).json()["choices"][0]["text"]
            middle = len(whole) // 2
            stop = next(whole[i:i + 2] for i in range(middle, len(whole)) if whole[i:i + 2].strip())
            cut = post(server.url + "/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
            _flush(server)
            spans = _request_spans(receiver, count=2)
        finally:
            server.close()
    assert cut["finish_reason"] == "stop" and cut["text"] == whole[:whole.index(stop)] != whole
    recorded = sorted(str(attrs(span.attributes)["output.value"]) for span in spans)
    assert recorded == sorted([whole, cut["text"]])


def test_metrics_carry_the_step_cost_model(model_files: ModelFiles) -> None:
    config = sim_config(ServiceConfig(port=0), profile="h200", itl_target_ms=50.0)
    server = LiveServer.start(config, cached_builder(model_files))
    try:
        assert post(f"{server.url}/v1/completions", {"prompt": "Hello there", "max_tokens": 5}).status == 200
        _flush(server)
        metrics = request("GET", f"{server.url}/metrics").body.decode()
    finally:
        server.close()
    counts = [line for line in metrics.splitlines() if line.startswith("pagedserve:step_cost_prediction_ratio_count")]
    assert counts and float(counts[0].split()[-1]) >= 5  # a prefill step and four decode steps, at least
    assert 'pagedserve:step_cost_prediction_ratio_bucket{le="1.05"}' in metrics
    for per in ("step", "token", "sampled", "context", "pair"):
        assert f'pagedserve:step_cost_seconds{{per="{per}"}}' in metrics
    assert "pagedserve:step_cost_headroom " in metrics
