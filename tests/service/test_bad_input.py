"""Every kind of bad input gets OpenAI's error JSON with the right status, and the server keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest

from service.http.body import MAX_JSON_DEPTH
from tests.service.live import LiveServer
from tests.service.rawhttp import exchange, parse_reply, post, request

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
BAD = "invalid_request_error"

CASES: list[tuple[str, str, Any, int, str, str | None]] = [
    # (name, path, body, status, error type, param)
    ("malformed json", CMPL, b'{"prompt": "a",', 400, BAD, None),
    ("not an object", CMPL, b"[1, 2]", 400, BAD, None),
    ("wrong type", CMPL, {"prompt": "a", "max_tokens": "ten"}, 400, BAD, "max_tokens"),
    ("wrong prompt type", CMPL, {"prompt": 5}, 400, BAD, "prompt"),
    ("missing prompt", CMPL, {"max_tokens": 5}, 400, BAD, "prompt"),
    ("missing messages", CHAT, {"max_tokens": 5}, 400, BAD, "messages"),
    ("negative max_tokens", CMPL, {"prompt": "a", "max_tokens": -3}, 400, BAD, "max_tokens"),
    ("huge max_tokens", CMPL, {"prompt": "a", "max_tokens": 10**9}, 400, BAD, "max_tokens"),
    ("absurd max_tokens", CMPL, {"prompt": "a", "max_tokens": 2**70}, 400, BAD, "max_tokens"),
    ("negative max_completion_tokens", CHAT, {"messages": USER, "max_completion_tokens": -1}, 400, BAD,
     "max_completion_tokens"),
    ("n zero", CMPL, {"prompt": "a", "n": 0}, 400, BAD, "n"),
    ("n too large", CHAT, {"messages": USER, "n": 1000}, 400, BAD, "n"),
    ("temperature out of range", CMPL, {"prompt": "a", "temperature": -1}, 400, BAD, "temperature"),
    ("top_p zero", CMPL, {"prompt": "a", "top_p": 0}, 400, BAD, "top_p"),
    ("too many logprobs", CMPL, {"prompt": "a", "logprobs": 50}, 400, BAD, "logprobs"),
    ("too many top_logprobs", CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 50}, 400, BAD,
     "top_logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400, BAD, "top_logprobs"),
    ("empty stop string", CMPL, {"prompt": "a", "stop": [""]}, 400, BAD, "stop[0]"),
    ("unknown model", CMPL, {"prompt": "a", "model": "gpt-9"}, 404, BAD, "model"),
    ("unknown field", CMPL, {"prompt": "a", "frobnicate": 1}, 400, BAD, "frobnicate"),
    ("tool without a function", CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, BAD,
     "tools[0].function"),
    ("unsupported field", CHAT, {"messages": USER, "logit_bias": {"1": 2.0}}, 400, BAD, "logit_bias"),
    ("empty prompt", CMPL, {"prompt": ""}, 400, BAD, "prompt"),
    ("empty prompt list", CMPL, {"prompt": []}, 400, BAD, "prompt"),
    ("mixed prompt list", CMPL, {"prompt": ["a", 5]}, 400, BAD, "prompt"),
    ("token id out of range", CMPL, {"prompt": [1, 10**6]}, 400, BAD, "prompt"),
    ("invalid utf-8", CMPL, b'{"prompt": "caf\xe9"}', 400, BAD, None),
    ("empty messages", CHAT, {"messages": []}, 400, BAD, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, BAD, "messages[0].role"),
    ("message without role", CHAT, {"messages": [{"content": "hi"}]}, 400, BAD, "messages[0].role"),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, BAD,
     "messages[0].content[0].type"),
    ("body over the limit", CMPL, {"prompt": "x" * 100_000}, 413, BAD, None),
]


def _still_serves(server: LiveServer) -> None:
    ok = post(server.url + CMPL, {"prompt": "Hello", "max_tokens": 2})
    assert ok.status == 200, ok.body
    assert ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(("name", "path", "body", "status", "type_", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(sim_server: LiveServer, name: str, path: str, body: Any, status: int, type_: str,
                   param: str | None) -> None:
    reply = post(sim_server.url + path, body)
    assert reply.status == status, reply.body
    error = reply.error()
    assert error["type"] == type_ and error["param"] == param and error["message"]
    assert reply.headers["Content-Type"].startswith("application/json")
    _still_serves(sim_server)


def test_prompt_longer_than_context_names_both_numbers(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": [100] * 9000, "max_tokens": 1})
    assert reply.status == 400
    error = reply.error()
    assert "8192" in error["message"] and "9000" in error["message"]
    assert error["code"] == "context_length_exceeded"
    _still_serves(sim_server)


def test_unknown_route_and_wrong_method(sim_server: LiveServer) -> None:
    assert request("GET", sim_server.url + "/v1/nothing").error()["type"] == "not_found_error"
    reply = request("GET", sim_server.url + CMPL)
    assert reply.status == 405 and reply.error()["type"] == BAD


def test_declared_oversize_body_is_refused_before_reading(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, b"{" + b" " * 70_000 + b"}")
    assert reply.status == 413 and reply.error()["code"] == "request_too_large"
    _still_serves(sim_server)


def test_wrong_method_names_the_allowed_ones(sim_server: LiveServer) -> None:
    reply = request("GET", sim_server.url + CMPL)
    assert reply.status == 405 and "POST" in reply.headers["Allow"]
    assert request("POST", sim_server.url + "/health").headers["Allow"] == "GET,HEAD"


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


DEEP: list[tuple[str, str, bytes]] = [
    # (name, path, body): each nests far past the decoder's recursion limit
    ("guided_json", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "guided_json": '
     + b'{"a": ' * 8_000 + b"1" + b"}" * 8_000 + b"}"),
    ("tool parameters", CHAT, f'{{"messages": [{{"role": "user", "content": "hi"}}], "tools": [{{"type": "function", '
     f'"function": {{"name": "f", "parameters": {{"x": {_nested(20_000)}}}}}}}]}}'.encode()),
    ("unknown field", CMPL, f'{{"prompt": "a", "frobnicate": {_nested(20_000)}}}'.encode()),
    ("unclosed", CMPL, b'{"prompt": ' + b"[" * 60_000),
]


@pytest.mark.parametrize(("name", "path", "body"), DEEP, ids=[d[0] for d in DEEP])
def test_deep_nesting_is_400_not_a_crash(sim_server: LiveServer, caplog: pytest.LogCaptureFixture, name: str,
                                        path: str, body: bytes) -> None:
    reply = post(sim_server.url + path, body)
    assert reply.status == 400 and reply.error()["code"] == "nesting_too_deep", reply.body
    assert not [r for r in caplog.records if r.exc_info]
    _still_serves(sim_server)


def test_nesting_up_to_the_limit_is_accepted(sim_server: LiveServer) -> None:
    def chat(depth: int) -> Any:  # body, tools, tool, function and parameters are five levels, "x" the rest
        tool = f'{{"type": "function", "function": {{"name": "f", "parameters": {{"x": {_nested(depth - 5)}}}}}}}'
        return f'{{"messages": {json.dumps(USER)}, "max_tokens": 1, "tool_choice": "none", "tools": [{tool}]}}'.encode()

    assert post(sim_server.url + CHAT, chat(MAX_JSON_DEPTH)).status == 200
    assert post(sim_server.url + CHAT, chat(MAX_JSON_DEPTH + 1)).error()["code"] == "nesting_too_deep"
    brackets_in_strings = {"prompt": "[" * 1000 + "{" * 1000, "max_tokens": 1}
    assert post(sim_server.url + CMPL, brackets_in_strings).status == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_a_body_that_is_not_json_is_415(sim_server: LiveServer, content_type: str) -> None:
    reply = request("POST", sim_server.url + CMPL, b'{"prompt": "a"}', {"Content-Type": content_type})
    assert reply.status == 415 and reply.error()["code"] == "unsupported_media_type"
    _still_serves(sim_server)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON", None])
def test_json_content_types_and_none_are_accepted(sim_server: LiveServer, content_type: str | None) -> None:
    body = b'{"prompt": "a", "max_tokens": 1}'
    head = f"Content-Type: {content_type}\r\n" if content_type else ""
    raw = (f"POST {CMPL} HTTP/1.1\r\nHost: t\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
           .encode() + body)
    reply = parse_reply(asyncio.run(exchange(sim_server.url, raw)))
    assert reply.status == 200, reply.body


@pytest.mark.parametrize(("encoding", "body"), [
    ("gzip", b'{"prompt": "not compressed at all"}'),
    ("gzip", gzip.compress(b'{"prompt": "a", "max_tokens": 1}')),
    ("gzip", gzip.compress(b"{" + b" " * 50_000_000 + b"}")),  # 50 MB once inflated: never inflated
    ("deflate", b'{"prompt": "a"}'),
    ("br", b'{"prompt": "a"}'),
])
def test_compressed_bodies_are_415(sim_server: LiveServer, encoding: str, body: bytes) -> None:
    reply = post(sim_server.url + CMPL, body, {"Content-Encoding": encoding})
    assert reply.status == 415 and reply.error()["code"] == "unsupported_content_encoding"
    _still_serves(sim_server)


def test_identity_encoding_is_accepted(sim_server: LiveServer) -> None:
    body = {"prompt": "a", "max_tokens": 1}
    assert post(sim_server.url + CMPL, body, {"Content-Encoding": "identity"}).status == 200
