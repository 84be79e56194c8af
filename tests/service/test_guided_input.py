"""Constrained decoding and tools through real HTTP on the sim backend: what is accepted, every bad input a
400 in OpenAI's error JSON naming its field, and the server unharmed afterwards."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.service.live import LiveServer
from tests.service.rawhttp import post, sse_events

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Answer."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"], "additionalProperties": False}}}


def chat(server: LiveServer, **fields: Any) -> Any:
    return post(server.url + CHAT, {"messages": USER, "max_tokens": 40, **fields})


BAD_CHAT = [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
     "response_format"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: nowhere"}, "guided_grammar"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_CHAT)
def test_bad_constraints_and_tools_are_a_400_naming_the_field(sim_server: LiveServer, fields: dict[str, Any],
                                                              param: str) -> None:
    reply = chat(sim_server, **fields)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param in (error.get("param") or "") or param in error["message"], error


def test_the_server_is_unharmed_after_bad_grammars(sim_server: LiveServer) -> None:
    for fields, _ in BAD_CHAT:
        chat(sim_server, **fields)
    reply = chat(sim_server, guided_regex="[a-z]{5}")
    assert reply.status == 200
    assert re.fullmatch("[a-z]{5}", reply.json()["choices"][0]["message"]["content"])
    assert sim_server.stats().num_requests == 0


@pytest.mark.parametrize(("fields", "pattern"), [
    ({"guided_regex": "[0-9]{4}"}, "[0-9]{4}"),
    ({"guided_choice": ["alpha", "beta"]}, "alpha|beta"),
    ({"guided_grammar": 'start: "go " ("left" | "right")'}, "go (left|right)"),
])
def test_completions_take_the_guided_fields(sim_server: LiveServer, fields: dict[str, Any], pattern: str) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "Go:", "max_tokens": 20, **fields})
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    assert re.fullmatch(pattern, choice["text"]) and choice["finish_reason"] == "stop"


def test_a_streamed_constrained_answer_is_the_whole_answer(sim_server: LiveServer) -> None:
    body = {"messages": USER, "max_tokens": 40, "stream": True, "guided_regex": "[a-z]{3}-[0-9]{3}"}
    events = [e for e in sse_events(post(sim_server.url + CHAT, body).body) if e != "[DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert re.fullmatch("[a-z]{3}-[0-9]{3}", text)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_forced_call_on_random_tokens_still_parses(sim_server: LiveServer) -> None:
    """The sim backend draws random allowed tokens: the grammar alone makes the answer a valid call (the
    model's own choices are tested with the real model). Enums only, so the random walk must end."""
    unit = {"type": "function", "function": {"name": "set_unit", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
        "additionalProperties": False}}}
    reply = chat(sim_server, tools=[WEATHER, unit], tool_choice={"type": "function", "function": {"name": "set_unit"}},
                 max_tokens=60)
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "set_unit" and call["id"].startswith("call_") and call["type"] == "function"
    assert json.loads(call["function"]["arguments"])["unit"] in ("celsius", "fahrenheit")
    assert choice["message"]["content"] is None
