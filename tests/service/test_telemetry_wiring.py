"""Telemetry through the real server: an incoming traceparent is continued by the request span exported over
OTLP/HTTP, and /metrics carries the engine's latency histograms."""

from __future__ import annotations

import time
from dataclasses import replace

import aiohttp
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from backends.model.loader import ModelFiles
from service.config import ServiceConfig, TelemetrySettings
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.telemetry.receiver import OtlpReceiver, attrs

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _request_spans(receiver: OtlpReceiver, deadline_s: float = 10.0) -> list[Span]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        spans = [s for s in receiver.spans if s.name == "llm.request"]
        if spans:
            return spans
        time.sleep(0.05)
    return []


def test_traceparent_is_continued_and_metrics_are_served(model_files: ModelFiles) -> None:
    with OtlpReceiver() as receiver:
        config = replace(sim_config(ServiceConfig(port=0)),
                         telemetry=TelemetrySettings(otlp_endpoint=receiver.endpoint))
        server = LiveServer.start(config, cached_builder(model_files))
        try:
            body = {"prompt": "Hello there", "max_tokens": 5, "temperature": 0}

            async def call() -> int:
                async with aiohttp.ClientSession() as session, session.post(
                        f"{server.url}/v1/completions", json=body, headers={"traceparent": TRACEPARENT}) as resp:
                    await resp.read()
                    return resp.status

            async def scrape() -> str:
                async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as metrics:
                    return await metrics.text()

            status = server.run(call())
            # the telemetry worker records asynchronously: let it catch up before reading what it recorded
            server.call(lambda: server.state.runtime.telemetry.flush(5.0))  # type: ignore[union-attr]
            metrics = server.run(scrape())
            assert status == 200
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
