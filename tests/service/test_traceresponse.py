"""The W3C traceresponse header: with traces on, generation responses (streamed ones too) name the server's
request span, in the incoming traceparent's trace; with traces off or the span not sampled, no header."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig, TelemetrySettings
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post
from tests.telemetry.receiver import OtlpReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
FORMAT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
CMPL = {"prompt": "Hello there", "max_tokens": 3}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def traced(model_files: ModelFiles) -> Iterator[tuple[LiveServer, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        settings = TelemetrySettings(otlp_endpoint=receiver.endpoint)
        server = LiveServer.start(replace(sim_config(ServiceConfig(port=0)), telemetry=settings),
                                  cached_builder(model_files))
        yield server, receiver
        server.close()


def _span(server: LiveServer, receiver: OtlpReceiver, span_id: str, deadline_s: float = 10.0) -> Span | None:
    server.call(lambda: server.state.runtime.telemetry.flush(5.0))  # type: ignore[union-attr]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = [s for s in receiver.spans if s.span_id.hex() == span_id]
        if found:
            return found[0]
        time.sleep(0.05)
    return None


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", CMPL), ("/v1/chat/completions", CHAT),
                                            ("/v1/completions", {**CMPL, "stream": True})])
def test_names_the_request_span_in_the_callers_trace(traced: tuple[LiveServer, OtlpReceiver], path: str,
                                                      body: dict[str, object]) -> None:
    server, receiver = traced
    reply = post(server.url + path, body, {"traceparent": TRACEPARENT})
    assert reply.status == 200, reply.body
    match = FORMAT.fullmatch(reply.headers["traceresponse"])
    assert match is not None and match.group(1) == TRACE_ID and match.group(3) == "01"
    span = _span(server, receiver, match.group(2))
    assert span is not None and span.name == "llm.request" and span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"


def test_a_new_trace_is_named_too(traced: tuple[LiveServer, OtlpReceiver]) -> None:
    server, receiver = traced
    match = FORMAT.fullmatch(post(server.url + "/v1/completions", CMPL).headers["traceresponse"])
    assert match is not None and match.group(1) != "0" * 32
    span = _span(server, receiver, match.group(2))
    assert span is not None and span.trace_id.hex() == match.group(1)


def test_no_header_when_the_span_is_not_sampled(traced: tuple[LiveServer, OtlpReceiver]) -> None:
    server, _ = traced
    unsampled = TRACEPARENT[:-2] + "00"
    reply = post(server.url + "/v1/completions", CMPL, {"traceparent": unsampled})
    assert reply.status == 200 and "traceresponse" not in reply.headers


def test_no_header_on_other_routes(traced: tuple[LiveServer, OtlpReceiver]) -> None:
    server, _ = traced
    reply = post(server.url + "/tokenize", {"prompt": "a"}, {"traceparent": TRACEPARENT})
    assert reply.status == 200 and "traceresponse" not in reply.headers


def test_no_header_when_tracing_is_off(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + "/v1/completions", CMPL, {"traceparent": TRACEPARENT})
    assert reply.status == 200 and "traceresponse" not in reply.headers
