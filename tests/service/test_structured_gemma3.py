"""Structured outputs and tool calls on Gemma 3's SentencePiece vocabulary (262,144 tokens: "▁" spaces, byte
pieces, thousands of control tokens), which llguidance reads through the same tokenizer as the model.

The cheap tests run the real engine on the sim backend, which draws random tokens of the real vocabulary from
what the grammar allows: whatever it picks, the answer must validate (jsonschema, an independent validator).
The slow ones ask the real model on the NumPy backend, through the official client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import numpy as np
import pytest
from openai import OpenAI

from backends.model.loader import ModelFiles
from backends.sampling import allowed_matrix
from scheduler.guided import GuideFactory
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, numpy_client, sim_config
from tests.service.rawhttp import post
from tests.service.test_guided_input import BAD_CHAT
from tests.service.test_structured_real import PROMPTS, TOOLS, Person, validated_calls

END_OF_TURN = "<end_of_turn>"
# Finite, so that the sim backend's random walk always ends; every kind of JSON value.
PET = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "kind": {"enum": ["cat", "dog", "ünïcode 🐍"]},
    "age": {"type": "integer", "minimum": 0, "maximum": 30}, "indoor": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
    "required": ["name", "kind", "age", "indoor", "tags"], "additionalProperties": False}
SET_UNIT: dict[str, Any] = {"type": "function", "function": {"name": "set_unit", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "loud": {"type": "boolean"}},
    "required": ["unit", "loud"], "additionalProperties": False}}}
# A base model of 270M parameters writes "100" as "1000000...": the amount is bounded so its calls end.
BOUNDED_TOOLS = [t if t["function"]["name"] != "convert_currency" else {**t, "function": {
    **t["function"], "parameters": {**t["function"]["parameters"], "properties": {
        **t["function"]["parameters"]["properties"], "amount": {"type": "number", "minimum": 0, "maximum": 1e6}}}}}
    for t in TOOLS]
CALL_PROMPTS = [PROMPTS[i] for i in (0, 1, 3, 6, 8, 9, 12, 19)]


@pytest.fixture(scope="module")
def files(gemma3_chat_files: ModelFiles) -> ModelFiles:
    return gemma3_chat_files


@pytest.fixture(scope="module")
def guides(files: ModelFiles) -> Iterator[GuideFactory]:
    factory = GuideFactory(files.tokenizer)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def sim(files: ModelFiles) -> Iterator[LiveServer]:
    server = LiveServer.start(sim_config(ServiceConfig(port=0)), cached_builder(files), timeout=120)
    yield server
    server.close()


@pytest.fixture(scope="module")
def sim_client(sim: LiveServer) -> OpenAI:
    return OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_llguidance_spells_every_kind_of_piece_as_the_model_does(files: ModelFiles, guides: GuideFactory) -> None:
    """Spaces ("▁"), runs of newlines (user-defined pieces), byte pieces of a character outside the
    vocabulary, and control tokens, which llguidance must know as special (never text a grammar can match)."""
    tok = files.tokenizer
    ids = tok.encode('{"name": "Zoë  \U0001d518",\n\n\t"n": 12}')
    byte_pieces = [i for i in ids if (tok.fast.id_to_token(i) or "").startswith("<0x")]
    assert byte_pieces and any(tok.token_bytes[i] == b"\n\n" for i in ids)  # the cases are there
    assert guides.tokenizer.decode_bytes(ids) == b"".join(tok.token_bytes[i] for i in ids)
    assert guides.tokenizer.decode_str(ids) == tok.decode(ids)
    end = tok.encode(END_OF_TURN)[0]
    assert all(guides.tokenizer.is_special_token(i) for i in (end, tok.bos_token_id, *tok.eos_token_ids))
    assert not any(guides.tokenizer.is_special_token(i) for i in ids)


def test_the_end_of_turn_ends_a_grammar_as_eos_does(files: ModelFiles, guides: GuideFactory) -> None:
    """llguidance knows one EOS (<eos>); a chat turn ends with <end_of_turn>, which must be allowed wherever
    the grammar may end, and followed as its end."""
    tok, end = files.tokenizer, files.tokenizer.encode(END_OF_TURN)[0]
    assert tok.eos_token_ids == (1, end)
    guide = guides.guide(guides.compile("regex", "a+", "guided_regex"))
    ok = allowed_matrix(np, guides.masks([guide], np.zeros(1, np.int32)).bits(), guides.vocab_size)[0]
    assert not ok[end] and not ok[1]  # "a" first
    assert guide.consume(tok.encode("a")[0]) is False
    ok = allowed_matrix(np, guides.masks([guide], np.zeros(1, np.int32)).bits(), guides.vocab_size)[0]
    assert ok[end] and ok[1] and not ok[tok.bos_token_id]
    assert guide.consume(end) is True and guide.error is None


@pytest.mark.parametrize("seed", range(6))
def test_random_tokens_under_a_schema_validate(sim_client: OpenAI, seed: int) -> None:
    out = sim_client.chat.completions.create(
        model=sim_client.models.list().data[0].id, seed=seed, temperature=1.0, max_tokens=200,
        messages=[{"role": "user", "content": "A pet, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": PET}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), PET)


def test_a_required_call_on_random_tokens_validates(sim_client: OpenAI) -> None:
    schemas = {"set_unit": SET_UNIT["function"]["parameters"]}
    for seed in range(4):
        out = sim_client.chat.completions.create(  # type: ignore[call-overload]
            model=sim_client.models.list().data[0].id, seed=seed, temperature=1.0, max_tokens=80,
            tools=[SET_UNIT], tool_choice="required", parallel_tool_calls=False,
            messages=[{"role": "user", "content": "Use celsius."}])
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        (call,) = choice.message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize(("fields", "param"), BAD_CHAT)
def test_bad_constraints_are_a_400_on_this_vocabulary(sim: LiveServer, fields: dict[str, Any], param: str) -> None:
    reply = post(sim.url + "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 20, **fields})
    assert reply.status == 400, reply.body
    error = reply.error()
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param in (error["param"] or "") or param in error["message"], error


def test_a_grammar_past_the_limits_is_a_400_and_the_server_goes_on(sim: LiveServer) -> None:
    url, user = sim.url + "/v1/chat/completions", [{"role": "user", "content": "Answer."}]
    reply = post(url, {"messages": user, "max_tokens": 30, "guided_regex": "[bc](a{1000}){1000}"})
    assert reply.status == 400 and "grammar" in reply.error()["message"], reply.body
    assert post(url, {"messages": user, "max_tokens": 10, "guided_regex": "[a-z]{3}"}).status == 200
    assert sim.stats().num_requests == 0


@pytest.fixture(scope="module")
def client(files: ModelFiles) -> Iterator[OpenAI]:
    with numpy_client(files, max_model_len=1024, num_blocks=320, timeout=600) as c:
        yield c


def _model(client: OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.mark.slow
def test_the_model_answers_a_json_schema(client: OpenAI) -> None:
    schema = {**Person.model_json_schema(), "additionalProperties": False}
    fields: dict[str, Any] = {
        "model": _model(client), "temperature": 0, "max_tokens": 60,
        "messages": [{"role": "user", "content": "Invent a person: name, age and city."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}}}
    whole = client.chat.completions.create(**fields).choices[0]
    assert whole.finish_reason == "stop", whole
    jsonschema.validate(json.loads(whole.message.content or ""), schema)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(**fields, stream=True)
              if c.choices]
    assert "".join(pieces) == whole.message.content


@pytest.mark.slow
def test_the_models_required_tool_calls_validate(client: OpenAI) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED_TOOLS}

    def ask(prompt: str) -> Any:
        return client.chat.completions.create(model=_model(client), temperature=0, max_tokens=100,  # type: ignore[call-overload]
                                              tools=BOUNDED_TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, messages=[{"role": "user", "content": prompt}])

    answers = [ask(CALL_PROMPTS[0])]  # alone: the others find the tools' long system prompt cached
    with ThreadPoolExecutor(len(CALL_PROMPTS)) as pool:
        answers += pool.map(ask, CALL_PROMPTS[1:])
    names = validated_calls(answers, schemas)
    assert len(set(names)) >= 3, names  # the model picks among the tools
