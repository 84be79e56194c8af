"""Structured outputs and tool calls from the real SmolLM2 model, through the official client: parsed by the
client's own helpers, validated against their schemas with jsonschema (an independent validator)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel

from backends.model.loader import ModelFiles
from tests.service.live import numpy_client

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow


class Person(BaseModel):
    name: str
    age: int
    city: str


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    _fn("get_weather", "Current weather in a city", {
        "city": {"type": "string", "maxLength": 40}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        ["city", "unit"]),
    _fn("get_time", "Current time in a time zone", {"timezone": {"type": "string", "maxLength": 40}}, ["timezone"]),
    _fn("convert_currency", "Convert an amount between currencies", {
        "amount": {"type": "number"}, "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "to": {"type": "string", "pattern": "^[A-Z]{3}$"}}, ["amount", "from", "to"]),
    _fn("search_web", "Search the web", {"query": {"type": "string", "maxLength": 60},
                                         "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
        ["query"]),
]
PROMPTS = [
    "What's the weather in Paris?", "Is it raining in Tokyo right now?", "How hot is it in Cairo in fahrenheit?",
    "What time is it in New York?", "Tell me the current time in Europe/Berlin.", "What's the time in Sydney?",
    "Convert 100 US dollars to euros.", "How many yen is 50 GBP?", "Exchange 20 EUR into CHF.",
    "Search the web for the tallest mountain.", "Find news about electric cars.", "Look up pasta recipes, 3 results.",
    "Weather in London in celsius, please.", "Do I need an umbrella in Seattle?", "What time is it in UTC?",
    "Convert 1000 INR to USD.", "Search for the population of Canada.", "Is it cold in Oslo today?",
    "What's the local time in Mumbai?", "Find the best hiking trails near Denver.",
]


@pytest.fixture(scope="module")
def client(model_files: ModelFiles) -> Iterator[OpenAI]:
    with numpy_client(model_files, max_model_len=1024, num_blocks=320, timeout=300) as c:
        yield c


def test_parse_helper_gets_a_pydantic_model(client: OpenAI) -> None:
    out = client.chat.completions.parse(
        model=MODEL, temperature=0, max_tokens=60, response_format=Person,
        messages=[{"role": "user", "content": "Invent a person: name, age and city."}])
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and out.choices[0].finish_reason == "stop"


def test_json_object_mode_gives_an_object(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "List two fruits as JSON."}])
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)


def test_streamed_json_is_the_same_answer(client: OpenAI) -> None:
    schema = {**Person.model_json_schema(), "additionalProperties": False}
    fields: dict[str, Any] = {
        "model": MODEL, "temperature": 0, "max_tokens": 60,
        "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": True, "schema": schema}}}
    whole = client.chat.completions.create(**fields).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**fields, stream=True)
              if c.choices]
    assert "".join(pieces) == whole and Person.model_validate_json(whole or "")


def _required_call(client: OpenAI, prompt: str) -> Any:
    return client.chat.completions.create(model=MODEL, temperature=0, max_tokens=120, tools=TOOLS,  # type: ignore[arg-type]
                                          tool_choice="required", parallel_tool_calls=False,
                                          messages=[{"role": "user", "content": prompt}])


def test_required_tool_calls_validate_on_twenty_prompts(client: OpenAI) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda p: _required_call(client, p), PROMPTS))
    names = validated_calls(answers, schemas)
    assert len(set(names)) >= 3  # the model picks among the tools, not one for everything


def validated_calls(answers: list[Any], schemas: dict[str, Any]) -> list[str]:
    """The tool each answer called, after checking it made exactly one call whose arguments fit the tool's schema."""
    names = []
    for answer in answers:
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        names.append(call.function.name)
    return names


def test_streamed_tool_call_reassembles_to_the_same_call(client: OpenAI) -> None:
    whole = _required_call(client, PROMPTS[0]).choices[0].message.tool_calls[0]
    stream = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=120, tools=TOOLS,  # type: ignore[arg-type]
                                            tool_choice="required", parallel_tool_calls=False, stream=True,
                                            messages=[{"role": "user", "content": PROMPTS[0]}])
    ids, names, arguments, reasons = set(), [], "", []
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.index == 0
            ids.add(delta.id) if delta.id else None
            names.append(delta.function.name) if delta.function and delta.function.name else None
            arguments += (delta.function.arguments or "") if delta.function else ""
        reasons.append(chunk.choices[0].finish_reason)
    assert len(ids) == 1 and names == [whole.function.name] and arguments == whole.function.arguments
    assert reasons[-1] == "tool_calls"


def test_a_named_function_is_the_one_called(client: OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=80, tools=TOOLS,  # type: ignore[arg-type]
                                         tool_choice={"type": "function", "function": {"name": "get_time"}},
                                         messages=[{"role": "user", "content": "What's the weather in Rome?"}])
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert "timezone" in json.loads(call.function.arguments)


def test_a_tool_result_in_the_history_is_answered(client: OpenAI) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    out = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=30, tools=TOOLS,  # type: ignore[arg-type]
                                         tool_choice="none", messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'}])
    message = out.choices[0].message
    assert message.tool_calls is None and message.content and out.choices[0].finish_reason in ("stop", "length")
