"""Heavy chat requests cost their sender: too many messages or tools, or too many bytes of tools, are refused
before anything is rendered; messages that cannot fit the context are refused before rendering by a bound
that never exceeds the rendered prompt's real length; every chat is rendered on the tokenizer threads; the
threads' queue is bounded (503 tokenizer_busy with Retry-After); a neighbour's stream is unharmed. OpenAI's
rules for tool messages hold."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from backends.model.chat_template import ChatTemplate
from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from service.generation.tokenize import PromptEncoder
from service.openai.chat_bounds import ChatLimits, Context, PromptBound, check_length, check_shape, measure
from service.openai.errors import APIError
from service.openai.prompts import chat_prompt
from service.openai.schemas.requests import ChatMessage
from service.routes import common
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, sse_events

CHAT, TOKENIZE = "/v1/chat/completions", "/tokenize"


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    limits = ServiceConfig(port=0, max_messages=50, max_tools=4, max_tool_bytes=2000)
    started = LiveServer.start(sim_config(limits, profile="cpu"), cached_builder(model_files))
    yield started
    started.close()


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every chat template rendering, in order."""
    names: list[str] = []
    real = ChatTemplate.render

    def recording(self: ChatTemplate, *args: Any, **kwargs: Any) -> str:
        names.append(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ChatTemplate, "render", recording)
    return names


def tool(i: int, description: str = "does a thing") -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"tool_{i}", "description": description,
                                             "parameters": {"type": "object", "properties": {}}}}


def turns(count: int, text: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(count)]


def refusal(reply: Any, code: str, param: str) -> str:
    assert reply.status == 400, reply.body
    error = reply.error()
    assert (error["code"], error["param"]) == (code, param)
    return str(error["message"])


@pytest.mark.parametrize("path", [CHAT, TOKENIZE])
@pytest.mark.parametrize(("body", "code", "param", "says"), [
    ({"messages": turns(51)}, "too_many_messages", "messages", "at most 50 messages"),
    ({"messages": turns(1), "tools": [tool(i) for i in range(5)]}, "too_many_tools", "tools", "at most 4 tools"),
    ({"messages": turns(1), "tools": [tool(0, "x" * 2000)]}, "tools_too_large", "tools", "at most 2000 are"),
])
def test_limits_refuse_before_rendering(server: LiveServer, rendered: list[str], path: str, body: dict[str, Any],
                                        code: str, param: str, says: str) -> None:
    assert says in refusal(post(server.url + path, body), code, param)
    assert rendered == []
    at_limit = {**body, "messages": turns(49), "tools": [tool(i) for i in range(4)], "max_tokens": 1}
    assert post(server.url + CHAT, at_limit).status == 200  # at the limits: served


def test_a_refusal_waits_twenty_times_what_counting_took(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    paced: list[float] = []

    async def recording(spent_s: float) -> None:
        paced.append(spent_s)

    monkeypatch.setattr(common, "pace_refusal", recording)
    assert post(server.url + CHAT, {"messages": turns(51)}).status == 400
    assert len(paced) == 1 and 0 < paced[0] < 1.0 and common.REFUSAL_PACE == 20
    assert post(server.url + CHAT, {"messages": turns(1), "max_tokens": 1}).status == 200
    assert len(paced) == 1  # a request served is never held


def test_messages_that_cannot_fit_are_refused_before_rendering(server: LiveServer, rendered: list[str]) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 140_000}]}  # 700 KB: over 8192 x 81 bytes
    message = refusal(post(server.url + CHAT, body), "context_length_exceeded", "messages")
    assert "has at least 8644 tokens" in message and rendered == []  # 2 markers, then 700,000 / 81 bytes


def test_turns_alone_can_refuse_before_the_body_is_decoded() -> None:
    limits, context = ChatLimits(4096, 128, 1 << 20), Context(PromptBound(2, 2, True), max_model_len=8192)
    body = {"messages": turns(2100, "x")}
    with pytest.raises(APIError) as refused:
        check_shape(json.dumps(body).encode(), limits, context)
    assert refused.value.code == "context_length_exceeded" and "at least 8400 tokens" in refused.value.message
    check_shape(json.dumps({"messages": turns(2047, "x")}).encode(), limits, context)  # 8188: may fit
    check_shape(json.dumps({**body, "truncate_prompt_tokens": 100}).encode(), limits, context)  # truncated: fits
    check_shape(json.dumps(body).encode(), limits)  # /tokenize: no context
    system = {"messages": [{"role": "system", "content": "x"}] * 2100}
    check_shape(json.dumps(system).encode(), limits, context)  # the bound counts only the roles it measured
    odd = {"messages": [{"role": 5}] * 5000, "tools": 3}  # wrong types: still counted, the full decode refuses
    with pytest.raises(APIError, match="at most 4096 messages"):
        check_shape(json.dumps(odd).encode(), limits, context)
    costly = {"messages": [{"role": [[[]]] * 100_000, "content": "x"}], "truncate_prompt_tokens": [[{}]] * 1000}
    check_shape(json.dumps(costly).encode(), limits, context)  # raw: no object built of either (the full decode
    # refuses the body); decoded as values, such a role took 160-180 ms of the event loop per request


def test_the_length_bound_never_exceeds_the_rendered_prompt(model_files: ModelFiles) -> None:
    bound = measure(model_files.chat_template, model_files.tokenizer)
    assert bound == PromptBound(2, 2, True)  # "<|im_start|>", "<|im_end|>" around "user\n" + text, then "\n"
    # the longest token is "\n" and 80 spaces: text of spaces and newlines merges with the markers' newlines
    texts = ["", "hi", "héllo wörld 🌍 " * 40, "a" * 3000, "def f(x):\n    return x ** 2\n" * 30, "ok?",
             " " * 80, "\n" + " " * 80, " " * 80 + "\n", "\n" * 81, "<|im_start|>user\n"]
    for count in (1, 2, 7, 40, 100):
        for offset in range(len(texts)):
            messages = [ChatMessage(role="user" if i % 2 == 0 else "assistant",
                                    content=texts[(i + offset) % len(texts)] if offset else " " * 80)
                        for i in range(count)]
            real = len(chat_prompt(messages, model_files.chat_template, model_files.tokenizer, 10**9))
            check_length(messages, bound, model_files.tokenizer, real + 1)  # a bound at most the real length
            with pytest.raises(APIError):
                check_length(messages, bound, model_files.tokenizer, count * 4)


def test_a_template_that_cannot_render_the_probes_gives_no_bound(model_files: ModelFiles) -> None:
    refusing = ChatTemplate("{{ raise_exception('no empty turns') }}", "", "")
    assert measure(refusing, model_files.tokenizer) == PromptBound()
    trimming = ChatTemplate("{% for m in messages %}<|im_start|>{{ m['content'] | trim }}<|im_end|>{% endfor %}")
    assert measure(trimming, model_files.tokenizer) == PromptBound(2, 0, counts_text=False)  # no text, no run


def test_every_chat_is_rendered_on_the_tokenizer_threads(server: LiveServer, rendered: list[str]) -> None:
    assert post(server.url + CHAT, {"messages": turns(1), "max_tokens": 1}).status == 200
    assert len(rendered) == 1 and rendered[0].startswith("pagedserve-tokenize")


def test_a_full_queue_is_refused_with_retry_after() -> None:
    release = threading.Event()

    async def body() -> tuple[APIError, int]:
        encoder = PromptEncoder(threads=1, queue=2)
        held = [asyncio.ensure_future(encoder.off_loop(release.wait, 10)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as refused:
            await encoder.off_loop(len, "x")
        held[0].cancel()  # a caller that left: its job still counts until it ends
        await asyncio.sleep(0.05)
        with pytest.raises(APIError):
            await encoder.off_loop(len, "x")
        release.set()
        await asyncio.gather(held[1])
        await asyncio.sleep(0.05)
        served = await encoder.off_loop(len, "xyz")
        encoder.close()
        return refused.value, served

    try:
        error, served = asyncio.run(body())
    finally:
        release.set()
    assert (error.status, error.code, error.headers) == (503, "tokenizer_busy", {"Retry-After": "1"})
    assert served == 3


def test_a_neighbours_stream_is_unharmed_by_refused_heavy_chats(server: LiveServer) -> None:
    heavy = {"messages": turns(60), "tools": [tool(i) for i in range(9)]}

    async def scenario() -> tuple[list[Any], list[int]]:
        async with aiohttp.ClientSession() as session:
            async def neighbour() -> list[Any]:
                body = {"messages": turns(1), "max_tokens": 24, "stream": True, "ignore_eos": True}
                async with session.post(server.url + CHAT, json=body) as reply:
                    return sse_events(await reply.read())

            async def attacker() -> list[int]:
                statuses = []
                for _ in range(20):
                    async with session.post(server.url + CHAT, json=heavy) as reply:
                        statuses.append(reply.status)
                return statuses

            events, statuses = await asyncio.gather(neighbour(), attacker())
            return events, statuses

    events, statuses = asyncio.run(scenario())
    assert set(statuses) == {400}
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")) >= 20


# --- OpenAI's rules for tool messages ---------------------------------------------------------------------------
def call(ident: str) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


ASKED = {"role": "user", "content": "weather?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]}


@pytest.mark.parametrize(("messages", "code", "param"), [
    ([ASKED, CALLED, {"role": "tool", "content": "sunny"}], "missing_tool_call_id", "messages[2].tool_call_id"),
    ([ASKED, {"role": "tool", "content": "sunny", "tool_call_id": "a"}], "invalid_tool_call_id",
     "messages[1].tool_call_id"),
    ([ASKED, CALLED, {"role": "tool", "content": "sunny", "tool_call_id": "c"}], "invalid_tool_call_id",
     "messages[2].tool_call_id"),
    ([ASKED, CALLED, {"role": "tool", "content": "sunny", "tool_call_id": "a"},
      {"role": "tool", "content": "again", "tool_call_id": "a"}], "invalid_tool_call_id", "messages[3].tool_call_id"),
    ([ASKED, CALLED, {"role": "tool", "content": "sunny", "tool_call_id": "a"}, ASKED], "missing_tool_result",
     "messages[3]"),
])
def test_tool_messages_are_checked_as_openai_checks_them(server: LiveServer, messages: list[Any], code: str,
                                                         param: str) -> None:
    refusal(post(server.url + CHAT, {"messages": messages}), code, param)


def test_answered_tool_calls_are_served(server: LiveServer) -> None:
    answered = [ASKED, CALLED, {"role": "tool", "content": "sunny", "tool_call_id": "b"},
                {"role": "tool", "content": "rainy", "tool_call_id": "a"}]
    assert post(server.url + CHAT, {"messages": answered, "max_tokens": 2}).status == 200
    # ending on unanswered calls is refused too, as OpenAI does
    refusal(post(server.url + CHAT, {"messages": [ASKED, CALLED]}), "missing_tool_result", "messages[2]")
