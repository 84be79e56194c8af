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


@pytest.mark.parametrize("choices", [["n\x04o", "yes"], ["\U00040000", "x"]])
def test_a_choice_the_model_cannot_write_is_a_400_naming_it(sim_server: LiveServer, choices: list[str]) -> None:
    """SmolLM2 has no token holding byte 04, nor F1 (plane 4's lead byte): such a choice, if sampled into, would
    fail mid-answer; it is refused before anything runs, the others served as ever."""
    reply = chat(sim_server, guided_choice=choices)
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["param"] == "guided_choice" and "cannot write" in error["message"], error
    assert chat(sim_server, guided_choice=[choices[1]]).status == 200


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
    ({"guided_choice": ["Ωmega 👍", "日本\x05"]}, "Ωmega 👍|日本\x05"),  # other scripts, emoji, a writable control
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


def test_a_grammar_that_breaks_mid_answer_is_a_400_not_a_wrong_answer(sim_server: LiveServer) -> None:
    """Past the matcher's limits (a lexer too big to build), the request fails with its reason; it never
    comes back as a 'stop' whose text does not match, and it takes no one else down."""
    # [bc] first: "(a{1000}){1000}" alone now fails on the first token, which compiling tries (a 400 up front)
    reply = chat(sim_server, guided_regex="[bc](a{1000}){1000}", max_tokens=30)
    assert reply.status == 400, reply.body
    assert "grammar" in reply.json()["error"]["message"]
    assert chat(sim_server, guided_regex="[a-z]{3}").status == 200
    assert sim_server.stats().num_requests == 0


@pytest.mark.parametrize("schema", [{"type": "integer", "maximum": 10**30}, {"const": 10**20}, {"enum": [2**64]}])
def test_integers_past_64_bits_in_a_schema_are_a_400(sim_server: LiveServer, schema: dict[str, Any]) -> None:
    reply = chat(sim_server, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert reply.status == 400 and reply.json()["error"]["param"] == "response_format", reply.body


def test_tool_parameters_with_defs_are_forced_as_given(sim_server: LiveServer) -> None:
    """pydantic's nested models: parameters refer to `#/$defs/...`, which must still resolve in the call."""
    parameters = {"$defs": {"Unit": {"enum": ["c", "f"]}}, "type": "object",
                  "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"], "additionalProperties": False}
    tool = {"type": "function", "function": {"name": "set_unit", "parameters": parameters}}
    reply = chat(sim_server, tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=60)
    assert reply.status == 200, reply.body
    (call,) = reply.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) in ({"unit": "c"}, {"unit": "f"})


def test_history_tool_calls_may_carry_a_streamed_index(sim_server: LiveServer) -> None:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert post(sim_server.url + CHAT, {"messages": messages, "max_tokens": 3, "tools": [WEATHER]}).status == 200
