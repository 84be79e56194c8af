"""X-Request-Id: echoed when the client sends a valid one, made up when not, on every answer (streams and
errors too), the suffix of the completion id, and on the request's span."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from openai import OpenAI

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig, TelemetrySettings
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import Reply, post, request, sse_events
from tests.telemetry.receiver import OtlpReceiver, attrs

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def rid(reply: Reply) -> str:
    """The X-Request-Id header, whatever its letter case."""
    return {k.lower(): v for k, v in reply.headers.items()}["x-request-id"]


def test_a_sent_id_is_echoed_and_names_the_completion(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "max_tokens": 2}, {"X-Request-Id": "job-42.a:b"})
    assert reply.status == 200 and rid(reply) == "job-42.a:b"
    assert reply.json()["id"] == "cmpl-job-42.a:b"


def test_an_id_is_made_up_when_none_is_sent(sim_server: LiveServer) -> None:
    first = post(sim_server.url + CHAT, {"messages": USER, "max_tokens": 2})
    second = post(sim_server.url + CHAT, {"messages": USER, "max_tokens": 2})
    ids = [rid(r) for r in (first, second)]
    assert ids[0] != ids[1] and all(ids)
    assert first.json()["id"] == f"chatcmpl-{ids[0]}"


def test_streams_carry_it_in_the_header_and_every_chunk(sim_server: LiveServer) -> None:
    body = {"messages": USER, "max_tokens": 3, "stream": True}
    reply = post(sim_server.url + CHAT, body, {"X-Request-Id": "stream-1"})
    assert reply.status == 200 and rid(reply) == "stream-1"
    events = [e for e in sse_events(reply.body) if e != "[DONE]"]
    assert events and all(e["id"] == "chatcmpl-stream-1" for e in events)


def test_the_same_id_twice_at_once_is_fine(sim_server: LiveServer) -> None:
    client = OpenAI(base_url=sim_server.url + "/v1", api_key="unused", max_retries=0,
                    default_headers={"X-Request-Id": "same"})
    stream = client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=4, stream=True)
    first = next(iter(stream))
    other = client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=2)
    assert first.id == other.id == "cmpl-same"
    assert other.usage is not None and other.usage.completion_tokens == 2
    stream.close()


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/nothing", "/metrics"])
def test_every_answer_has_one(sim_server: LiveServer, path: str) -> None:
    assert rid(request("GET", sim_server.url + path, headers={"X-Request-Id": "r1"})) == "r1"
    assert rid(request("GET", sim_server.url + path))


def test_errors_have_one(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "frobnicate": 1}, {"X-Request-Id": "bad-body"})
    assert reply.status == 400 and rid(reply) == "bad-body"


@pytest.mark.parametrize("value", ["x" * 129, "has space", "semi;colon", "quote\"", "caf\u00e9", "<tag>"])
def test_a_bad_id_is_400(sim_server: LiveServer, value: str) -> None:
    headers = {"X-Request-Id": value.encode().decode("latin-1")}
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "max_tokens": 1}, headers)
    assert reply.status == 400, reply.body
    error = reply.error()
    assert error["param"] == "X-Request-Id" and error["type"] == "invalid_request_error"
    assert rid(reply) != value


def test_the_longest_id_is_accepted(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "max_tokens": 1}, {"X-Request-Id": "a" * 128})
    assert reply.status == 200 and rid(reply) == "a" * 128


def test_the_request_span_has_it(model_files: ModelFiles) -> None:
    with OtlpReceiver() as receiver:
        settings = TelemetrySettings(otlp_endpoint=receiver.endpoint)
        server = LiveServer.start(replace(sim_config(ServiceConfig(port=0)), telemetry=settings),
                                  cached_builder(model_files))
        try:
            reply = post(server.url + CMPL, {"prompt": "hi", "max_tokens": 2}, {"X-Request-Id": "traced-7"})
            assert reply.status == 200
            server.call(lambda: server.state.runtime.telemetry.flush(5.0))  # type: ignore[union-attr]
            end = time.monotonic() + 10
            while not [s for s in receiver.spans if s.name == "llm.request"] and time.monotonic() < end:
                time.sleep(0.05)
            spans = [s for s in receiver.spans if s.name == "llm.request"]
        finally:
            server.close()
    assert len(spans) == 1
    assert "traced-7" in str(attrs(spans[0].attributes)["http.request.header.x-request-id"])
