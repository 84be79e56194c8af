"""Tool calls parsed out of text (whole or streamed in any pieces), the answers' shapes, and the prompt the
model sees for tools, calls and results."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.model.chat_template import CHATML_TEMPLATE, ChatTemplate
from scheduler.outputs import ChoiceDelta
from service.openai.formats import ChatFormatter, Identity
from service.openai.prompts import chat_prompt
from service.openai.schemas.requests import ChatMessage, Tool
from service.openai.tool_calls import ToolCallParser, parse_tool_calls
from service.openai.tools import call_grammar

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "nested": {"a": [1, "}"]}}}\n</tool_call>'
TWO = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
WEATHER_ARGS = '{"city": "Paris", "nested": {"a": [1, "}"]}}'


def test_whole_text_calls_and_content() -> None:
    content, calls = parse_tool_calls("Let me check.\n" + TWO)
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", WEATHER_ARGS), ("get_time", "{}")]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


def test_text_without_calls_is_all_content() -> None:
    for text in ("plain answer", "a <tool but no call", "x < y and <tool_call"):
        content, calls = parse_tool_calls(text)
        assert calls == [] and content == text


def test_a_call_left_open_ends_with_the_text() -> None:
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]


def _streamed(text: str, cuts: list[int]) -> tuple[str, dict[int, tuple[set[str], list[str], str]]]:
    parser, content, calls = ToolCallParser(), "", {}
    bounds = [0, *sorted(set(cuts)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    outs = [parser.feed(p) for p in pieces] + [parser.finish()]
    for text_part, deltas in outs:
        content += text_part
        for d in deltas:
            ids, names, args = calls.setdefault(d.index, (set(), [], ""))
            ids |= {d.id} if d.id else set()
            calls[d.index] = (ids, names + ([d.name] if d.name else []), args + d.arguments)
    return content, calls


@given(st.lists(st.integers(min_value=0, max_value=len("Sure. " + TWO)), max_size=30))
def test_streaming_in_any_pieces_gives_the_whole_texts_calls(cuts: list[int]) -> None:
    content, calls = _streamed("Sure. " + TWO, cuts)
    assert content == "Sure."
    assert calls[0][1] == ["get_weather"] and calls[0][2] == WEATHER_ARGS and len(calls[0][0]) == 1
    assert calls[1][1] == ["get_time"] and calls[1][2] == "{}"


def test_arguments_stream_before_the_call_closes() -> None:
    parser = ToolCallParser()
    _, first = parser.feed('<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert first[0].name == "f" and first[1].arguments == '{"city": "Par'


def _fmt() -> ChatFormatter:
    return ChatFormatter(Identity("chatcmpl-1", 0, "m"), None, False, tool_calls=True)  # type: ignore[arg-type]


def test_an_answer_with_calls_has_tool_calls_and_their_finish_reason() -> None:
    body = msgspec.to_builtins(_fmt().response([ChoiceDelta(0, CALL, finish_reason="stop")], None))  # type: ignore[arg-type]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"] == {"name": "get_weather", "arguments": WEATHER_ARGS}


def test_an_answer_cut_by_length_keeps_length() -> None:
    body = msgspec.to_builtins(_fmt().response([ChoiceDelta(0, CALL, finish_reason="length")], None))  # type: ignore[arg-type]
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_plain_answer_has_no_tool_calls_field() -> None:
    body = msgspec.json.decode(msgspec.json.encode(_fmt().response([ChoiceDelta(0, "Hi", finish_reason="stop")], None)))  # type: ignore[arg-type]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hi"}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_streamed_chunks_follow_openais_delta_format() -> None:
    fmt, events = _fmt(), []
    for i, piece in enumerate([CALL[:20], CALL[20:60], CALL[60:]]):
        events.append(fmt.chunk(0, ChoiceDelta(0, piece, finish_reason="stop" if i == 2 else None)))
    deltas = [json.loads(e[len(b"data: "):]) for e in events if e]
    calls = [c for d in deltas for c in d["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in c and "name" not in c["function"] for c in calls[1:])
    assert "".join(c["function"]["arguments"] for c in calls) == WEATHER_ARGS
    assert deltas[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("content" not in d["choices"][0]["delta"] for d in deltas)


TOOLS = msgspec.convert([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}], list[Tool])


class Spelled:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    max_token_bytes = 4
    vocab_size = 0x110000


def _render(messages: list[dict[str, object]], template: ChatTemplate, tools: list[Tool] | None) -> str:
    ids = chat_prompt(msgspec.convert(messages, list[ChatMessage]), template, Spelled(), 100_000,  # type: ignore[arg-type]
                      True, tools)
    return "".join(map(chr, ids))


def test_a_template_without_tools_gets_the_generic_format() -> None:
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    text = _render(history, ChatTemplate(CHATML_TEMPLATE), TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text
    assert parse_tool_calls(text.split("<|im_start|>assistant\n")[1])[1][0].arguments == '{"city": "Paris"}'


def test_tools_join_an_existing_system_message() -> None:
    text = _render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                   ChatTemplate(CHATML_TEMPLATE), TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_a_template_with_tools_renders_them_itself() -> None:
    native = ChatTemplate("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                          "{% for m in messages %}{{ m.role }}:{{ m.content }}"
                          "{% for c in m.tool_calls or [] %}<{{ c.function.arguments.city }}>{% endfor %};{% endfor %}")
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]  # a call is answered (OpenAI's rule)
    assert _render(history, native, TOOLS) == "[get_weather]user:Hi;assistant:<Oslo>;tool:sunny;"


def test_without_tools_the_prompt_is_unchanged() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert "# Tools" not in _render(messages, ChatTemplate(CHATML_TEMPLATE), None)


@pytest.mark.parametrize("single", [True, False])
def test_the_call_grammar_names_every_function_once(single: bool) -> None:
    grammar = call_grammar(TOOLS * 1, single)
    assert grammar.count("%json") == 1 and ("(_NL block)*" in grammar) is not single


def test_a_closing_tag_inside_a_string_is_text() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"s": "x</tool_call>y"}}\n</tool_call>\nafter'
    content, calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"s": "x</tool_call>y"}')] and content == "\nafter"
    for cut in range(len(text)):
        streamed, parsed = _streamed(text, [cut])
        assert parsed[0][2] == '{"s": "x</tool_call>y"}' and streamed == "\nafter"


def test_space_before_the_call_objects_end_is_never_streamed() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1} }\n</tool_call>'
    assert parse_tool_calls(text)[1][0].arguments == '{"a": 1}'
    for cut in range(len(text)):
        assert _streamed(text, [cut])[1][0][2] == '{"a": 1}'


def test_without_parallel_calls_only_the_first_call_is_kept() -> None:
    content, calls = parse_tool_calls("Sure. " + TWO, max_calls=1)
    assert content == "Sure." and [c.name for c in calls] == ["get_weather"]
    fmt = ChatFormatter(Identity("chatcmpl-1", 0, "m"), None, False, tool_calls=True, max_calls=1)  # type: ignore[arg-type]
    events = [fmt.chunk(0, ChoiceDelta(0, piece)) for piece in (TWO[:50], TWO[50:120])]
    events.append(fmt.chunk(0, ChoiceDelta(0, TWO[120:], finish_reason="stop")))
    deltas = [json.loads(e[len(b"data: "):]) for e in events if e]
    calls_seen = {c["index"] for d in deltas for c in d["choices"][0]["delta"].get("tool_calls", [])}
    assert calls_seen == {0} and deltas[-1]["choices"][0]["finish_reason"] == "tool_calls"
