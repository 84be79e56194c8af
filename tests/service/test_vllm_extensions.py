"""vLLM's request extensions through real HTTP and the official client: accepted, and doing what they say."""

from __future__ import annotations

from typing import Any

import pytest
from openai import BadRequestError, OpenAI

from tests.service.live import LiveServer
from tests.service.rawhttp import post, sse_events

MODEL = "SmolLM2-135M-Instruct"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def client(sim_server: LiveServer) -> OpenAI:
    return OpenAI(base_url=sim_server.url + "/v1", api_key="unused", max_retries=0)


def _usage_ok(usage: Any, prompt: int) -> None:
    assert usage is not None and usage.prompt_tokens == prompt
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_continuous_usage_stats_in_every_chat_chunk(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=6, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True, "continuous_usage_stats": True})  # type: ignore[typeddict-unknown-key]
    chunks = list(stream)
    prompt = chunks[-1].usage.prompt_tokens if chunks[-1].usage else -1
    for chunk in chunks:
        _usage_ok(chunk.usage, prompt)
    counts = [c.usage.completion_tokens for c in chunks if c.usage]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert chunks[-1].choices == []


def test_continuous_usage_stats_in_every_completion_chunk(sim_server: LiveServer) -> None:
    body = {"prompt": "Hello there", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    reply = post(sim_server.url + CMPL, body)
    assert reply.status == 200, reply.body
    events = [e for e in sse_events(reply.body) if e != "[DONE]"]
    assert events and all(e["usage"]["total_tokens"] >= e["usage"]["prompt_tokens"] > 0 for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 5


def test_continuous_usage_stats_needs_include_usage(sim_server: LiveServer) -> None:
    body = {"prompt": "Hello there", "max_tokens": 3, "stream": True,
            "stream_options": {"continuous_usage_stats": True}}
    events = sse_events(post(sim_server.url + CMPL, body).body)
    assert all("usage" not in e for e in events if e != "[DONE]")


def test_include_stop_str_in_output(client: OpenAI) -> None:
    base = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0)
    text = base.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    expected = text[:text.index(stop) + len(stop)]
    extra = {"include_stop_str_in_output": True}
    out = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0, stop=[stop],
                                    extra_body=extra)
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0,
                                         stop=stop, stream=True, extra_body=extra)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_spaces_between_special_tokens_is_accepted(client: OpenAI) -> None:
    for value in (True, False):
        out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                        extra_body={"spaces_between_special_tokens": value,
                                                    "skip_special_tokens": False})
        assert out.usage is not None and out.usage.completion_tokens == 2


def test_truncate_prompt_tokens_keeps_the_last_tokens(client: OpenAI) -> None:
    long_prompt = "one two three four five six seven eight nine ten"
    whole = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2)
    assert whole.usage is not None and whole.usage.prompt_tokens > 4
    out = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=2,
                                    extra_body={"truncate_prompt_tokens": 4})
    assert out.usage is not None and out.usage.prompt_tokens == 4
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2,  # type: ignore[arg-type]
                                          extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage is not None and chat.usage.prompt_tokens == 3


def test_truncate_prompt_tokens_lets_a_too_long_prompt_fit(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": [100] * 9000, "max_tokens": 1, "truncate_prompt_tokens": 100})
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["prompt_tokens"] == 100
    reply = post(sim_server.url + CMPL, {"prompt": "word " * 9000, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert reply.status == 400 and reply.error()["code"] == "context_length_exceeded"  # the whole context: no room


def test_truncate_prompt_tokens_past_the_context_keeps_what_fits(sim_server: LiveServer) -> None:
    for value in (0, 10**6):
        reply = post(sim_server.url + CMPL, {"prompt": [100] * 9000, "max_tokens": 1, "truncate_prompt_tokens": value})
        assert reply.status == 400 and reply.error()["code"] == "context_length_exceeded"  # no room left to answer
        reply = post(sim_server.url + CMPL, {"prompt": [100] * 50, "max_tokens": 1, "truncate_prompt_tokens": value})
        assert reply.status == 200 and reply.json()["usage"]["prompt_tokens"] == 50


@pytest.mark.parametrize("value", [-2, -100, "ten", 2**40, 1.5])
@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_bad_truncate_prompt_tokens_is_400(sim_server: LiveServer, path: str, value: Any) -> None:
    body: dict[str, Any] = {"prompt": "hi"} if path == CMPL else {"messages": USER}
    reply = post(sim_server.url + path, {**body, "max_tokens": 1, "truncate_prompt_tokens": value})
    assert reply.status == 400, reply.body
    assert reply.error()["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize(("field", "value"), [("include_stop_str_in_output", "yes"),
                                              ("spaces_between_special_tokens", 3)])
def test_bad_extension_types_are_400(sim_server: LiveServer, field: str, value: Any) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", field: value})
    assert reply.status == 400 and reply.error()["param"] == field


def test_bad_stream_options_are_400(sim_server: LiveServer) -> None:
    for options in ({"continuous_usage_stats": "on"}, {"frobnicate": True}):
        reply = post(sim_server.url + CMPL, {"prompt": "hi", "stream": True, "stream_options": options})
        assert reply.status == 400, reply.body
        assert reply.error()["type"] == "invalid_request_error"


def test_unknown_fields_stay_refused(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1, extra_body={"use_beam_search": True})
    assert info.value.status_code == 400
