"""Small promises over real HTTP on the sim backend: every ended choice carries a finish_reason, grammar errors
are in the server's own words (the grammar engine's text goes to the log), a lone surrogate is named with its
field, echoed client strings are bounded."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from scheduler.guide_errors import described
from scheduler.guided import GuideFactory
from service.config.settings import AppConfig, ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import Reply, post, request, sse_events

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    live = LiveServer.start(sim_config(ServiceConfig(port=0, max_body_bytes=1 << 20)), cached_builder(model_files))
    yield live
    live.close()


def started(config: AppConfig, files: ModelFiles) -> LiveServer:
    return LiveServer.start(config, cached_builder(files))


# --- 1. every ended choice carries a finish_reason --------------------------------------------------------
def finish_reasons(events: list[Any]) -> dict[int, str]:
    return {c["index"]: c["finish_reason"] for e in events if isinstance(e, dict) and "choices" in e
            for c in e["choices"] if c.get("finish_reason")}


def stream_body(path: str, n: int, prompts: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 1000, "n": n, "stream": True, "ignore_eos": True}
    if path == CHAT:
        return {**body, "messages": USER}
    return {**body, "prompt": "Hello there" if prompts == 1 else ["Hello there"] * prompts}


@pytest.fixture(scope="module")
def slow_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    """A step every ~20 ms (the cpu profile) and a request timeout of 0.5 s: a 1000-token answer is cut."""
    config = AppConfig(ServiceConfig(port=0, request_timeout_s=0.5), BackendConfig(name="sim", sim_profile="cpu"),
                       SchedulerConfig(), KVPoolConfig(num_blocks=512))
    live = started(config, model_files)
    yield live
    live.close()


@pytest.mark.parametrize(("path", "prompts"), [(CMPL, 1), (CMPL, 2), (CHAT, 1)])
def test_a_timed_out_stream_ends_every_choice_with_abort(slow_server: LiveServer, path: str, prompts: int) -> None:
    reply = post(slow_server.url + path, stream_body(path, 2, prompts))
    events = sse_events(reply.body)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
    assert finish_reasons(events) == {i: "abort" for i in range(2 * prompts)}
    last = max(i for i, e in enumerate(events) if isinstance(e, dict) and "choices" in e)
    assert last < len(events) - 2  # the abort chunks come before the error event


def test_a_timed_out_plain_request_is_a_504(slow_server: LiveServer) -> None:
    reply = post(slow_server.url + CMPL, {**stream_body(CMPL, 1), "stream": False})
    assert reply.status == 504 and reply.error()["code"] == "request_timeout"


def test_a_failed_prompt_ends_its_neighbours_with_abort(model_files: ModelFiles) -> None:
    """A bad token fails one prompt's request; the other prompt of the same HTTP request is cut too."""
    config = AppConfig(ServiceConfig(port=0), BackendConfig(name="sim", sim_profile="zero", sim_faults="bad_token@4"),
                       SchedulerConfig(), KVPoolConfig(num_blocks=256))
    live = started(config, model_files)
    try:
        events = sse_events(post(live.url + CMPL, stream_body(CMPL, 1, prompts=2)).body)
    finally:
        live.close()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_error"
    assert finish_reasons(events) == {0: "abort", 1: "abort"}


# --- 2. grammar errors in our own words -------------------------------------------------------------------
ENGINE_WORDS = ("NoExtensionBias", "non-verbose", "ff_tokens", "limit", "fuel", "parser error", "Lark", "\n",
                "regex parse error", "Unsatisfiable", "Pointer", "registry", "Unimplemented")
RECURSIVE = {"$defs": {"n": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]}},
             "$ref": "#/$defs/n"}
GRAMMARS: list[tuple[str, Any, str]] = [
    ("guided_regex", "[^\\s\\S]", "guided_regex: the regular expression matches no string"),
    ("guided_regex", "(unclosed", "guided_regex: the regular expression is not valid (unclosed group)"),
    ("guided_regex", "a\\1", "guided_regex: the regular expression is not valid (backreferences are not supported)"),
    ("guided_grammar", "start: foo", 'guided_grammar: the grammar refers to an undefined rule or terminal "foo"'),
    ("guided_grammar", "start: a\na: a", "guided_grammar: the grammar matches no string"),
    ("guided_grammar", "garbage ::: =", "guided_grammar: the grammar has a syntax error at line 1, column 10"),
    ("guided_json", {"type": "foo"}, 'guided_json: the JSON schema has an unknown type "foo"'),
    ("guided_json", {"not": {"type": "string"}},
     'guided_json: the JSON schema uses keywords this server does not support: "not"'),
    ("guided_json", {"$ref": "#/nope"}, "guided_json: the JSON schema has a $ref that does not resolve"),
    ("guided_json", {"type": "integer", "minimum": 5, "maximum": 1}, "guided_json: the JSON schema matches no string"),
    ("guided_json", {"$ref": "#"}, "guided_json: the JSON schema matches no string"),
    # no finite value: caught on the first token when compiling, not mid-answer
    ("guided_json", RECURSIVE, "guided_json: the JSON schema is too large or too deeply recursive to compile"),
]


@pytest.mark.parametrize(("field", "value", "message"), GRAMMARS, ids=[f"{f}:{m[len(f) + 2:]}" for f, _, m in GRAMMARS])
def test_grammar_errors_are_in_our_words(server: LiveServer, caplog: pytest.LogCaptureFixture, field: str,
                                         value: Any, message: str) -> None:
    with caplog.at_level(logging.INFO):
        reply = post(server.url + CMPL, {"prompt": "Hi", "max_tokens": 4, field: value})
    assert reply.status == 400, reply.body
    error = reply.error()
    assert error["message"].startswith(message) and error["param"] == field
    assert not [w for w in ENGINE_WORDS if w in error["message"]], error["message"]
    request_id = next(v for k, v in reply.headers.items() if k.lower() == "x-request-id")
    logged = [r.getMessage() for r in caplog.records if request_id in r.getMessage()]
    assert any(error["message"] + " (" in m for m in logged), logged  # and the engine's own text after it


def test_a_grammar_that_breaks_mid_answer_is_said_in_our_words(server: LiveServer,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        reply = post(server.url + CMPL, {"prompt": "Hi", "max_tokens": 8, "guided_regex": "[bc](a{1000}){1000}"})
    assert reply.status == 400 and reply.error()["code"] == "grammar_failed"
    assert reply.error()["message"] == ("the output could not follow its grammar: the regular expression is too "
                                        "large or too deeply recursive to follow")
    assert any("the grammar engine says: lexer error" in r.getMessage() for r in caplog.records)


def test_a_guide_says_what_broke_in_our_words(model_files: ModelFiles) -> None:
    """Only a backend that ignores the mask can leave the grammar (as here); the engine's text is not shown."""
    guides = GuideFactory(model_files.tokenizer)
    guide = guides.guide(guides.compile("regex", "ab", "guided_regex"))
    guide.consume(model_files.tokenizer.encode("z")[0])
    assert guide.error == "the regular expression cannot be followed" and guide.detail != guide.error


def test_an_unknown_grammar_error_gets_a_generic_message() -> None:
    assert described("something new went wrong <x/>", "regex") == "cannot be compiled"
    assert described("Too many items (limit 50000; ff_tokens)", "lark", "follow") == \
        "is too large or too deeply recursive to follow"


# --- 3. a lone surrogate names its field ------------------------------------------------------------------
LONE = "\\ud800"
SURROGATES: list[tuple[str, str, str]] = [
    (CMPL, '{"prompt": "Hi", "stop": "%s"}', "stop"),
    (CMPL, '{"prompt": "Hi", "stop": ["a", "x%s"]}', "stop[1]"),
    (CMPL, '{"prompt": "%s"}', "prompt"),
    (CMPL, '{"prompt": ["ok", "%s"]}', "prompt[1]"),
    (CMPL, '{"prompt": "Hi", "guided_regex": "%s"}', "guided_regex"),
    (CMPL, '{"prompt": "Hi", "guided_choice": ["a", "%s"]}', "guided_choice[1]"),
    (CMPL, '{"prompt": "Hi", "guided_json": {"enum": ["%s"]}}', "guided_json.enum[0]"),
    (CMPL, '{"prompt": "Hi", "model": "%s"}', "model"),
    (CMPL, '{"prompt": "Hi", "%s": 1}', "a field name"),
    (CHAT, '{"messages": [{"role": "user", "content": "%s"}]}', "messages[0].content"),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]}]}',
     "messages[0].content[0].text"),
    (CHAT, '{"messages": [{"role": "user", "content": "Hi"}], '
           '"tools": [{"type": "function", "function": {"name": "%s"}}]}', "tools[0].function.name"),
    ("/tokenize", '{"prompt": "%s"}', "prompt"),
]


@pytest.mark.parametrize(("path", "body", "field"), SURROGATES, ids=[f for _, _, f in SURROGATES])
@pytest.mark.parametrize("lone", [LONE, "\\udc00"])
def test_a_lone_surrogate_is_named_with_its_field(server: LiveServer, path: str, body: str, field: str,
                                                  lone: str) -> None:
    reply = post(server.url + path, (body % lone).encode())
    assert reply.status == 400
    error = reply.error()
    assert error["message"] == f"{field} contains a lone UTF-16 surrogate ({lone}), which is not valid text"
    assert error["param"] == (None if field == "a field name" else field) and error["code"] == "invalid_text"


def test_a_surrogate_pair_is_text(server: LiveServer) -> None:
    reply = post(server.url + CMPL, b'{"prompt": "Hi", "max_tokens": 2, "stop": "\\ud83d\\ude00"}')
    assert reply.status == 200


def test_truncated_json_is_still_truncated(server: LiveServer) -> None:
    reply = post(server.url + CMPL, b'{"prompt": "Hi", "stop": "')
    assert reply.status == 400 and reply.error()["code"] == "invalid_json"


# --- 4. echoed client strings are bounded -----------------------------------------------------------------
HUGE = "m" * 100_000


def bounded(reply: Reply, status: int) -> dict[str, Any]:
    assert reply.status == status, reply.body[:300]
    assert len(reply.body) < 1500, len(reply.body)
    error = reply.error()
    assert "…" in error["message"] and "100000 characters" in error["message"], error["message"]
    return error


@pytest.mark.parametrize(("path", "body"), [
    (CMPL, {"prompt": "Hi", "model": HUGE}),
    (CHAT, {"messages": USER, "model": HUGE}),
    ("/tokenize", {"prompt": "Hi", "model": HUGE}),
    ("/detokenize", {"tokens": [1], "model": HUGE}),
], ids=["completions", "chat", "tokenize", "detokenize"])
def test_a_huge_model_name_is_echoed_bounded(server: LiveServer, path: str, body: dict[str, Any]) -> None:
    error = bounded(post(server.url + path, body), 404)
    assert error["code"] == "model_not_found" and error["message"].startswith("The model `" + "m" * 256 + "…")


@pytest.mark.parametrize(("path", "body", "param"), [
    (CMPL, {"prompt": "Hi", HUGE: 1}, "m" * 256 + "…"),
    (CHAT, {"messages": [{"role": HUGE, "content": "Hi"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": HUGE, "text": "x"}]}]},
     "messages[0].content[0].type"),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": HUGE}}}, "tool_choice"),
], ids=["unknown field", "enum value", "content part type", "tool_choice name"])
def test_other_echoed_strings_are_bounded(server: LiveServer, path: str, body: dict[str, Any], param: str) -> None:
    error = bounded(post(server.url + path, body), 400)
    assert error["param"].startswith(param.removesuffix("…")) and len(error["param"]) < 400


def test_a_short_model_name_is_echoed_whole(server: LiveServer) -> None:
    reply = request("GET", server.url + "/v1/models/no-such-model")
    assert reply.status == 404 and "`no-such-model`" in reply.error()["message"]
