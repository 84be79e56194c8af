"""Request bodies from the server's own request schemas: valid ones the server must serve, and the verdict on
any other. Two schemas judge every body: the one msgspec emits for the request Structs (what decoding enforces) and
a servable narrowing of it (the ranges the server's own checks accept, kept small so that serving is cheap).
A body outside the first must be refused, one inside the second must be served, anything between may go
either way; none may fail the server."""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from bench.reliability.schema_gen import Schema, SchemaGen
from service.openai.schemas.requests import ChatRequest, CompletionRequest

SERVABLE = "Servable"  # prefix of the narrowed definitions' names


class Expect(enum.Enum):
    SERVED = "served"  # 200
    REFUSED = "refused"  # 4xx
    EITHER = "either"  # anything but 5xx


@dataclass(frozen=True)
class Endpoint:
    path: str
    schema: str  # its request definition in $defs


COMPLETIONS = Endpoint("/v1/completions", "CompletionRequest")
CHAT = Endpoint("/v1/chat/completions", "ChatRequest")
ENDPOINTS = (COMPLETIONS, CHAT)


@dataclass(frozen=True)
class Body:
    endpoint: Endpoint
    value: Any  # the JSON value sent (BadTokens written verbatim)
    kind: str  # "valid" or the mutation's name


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def request_gen(model: str) -> SchemaGen:
    """A generator over the request schemas plus their servable narrowings (`Servable<Name>`)."""
    _, defs = msgspec.json.schema_components([CompletionRequest, ChatRequest])
    narrowed = {SERVABLE + name: _narrow(defs[name], props) for name, props in _servable(model).items()}
    return SchemaGen({**defs, **narrowed})


def expectation(gen: SchemaGen, endpoint: Endpoint, value: Any) -> Expect:
    if not gen.conforms(ref(endpoint.schema), value):
        return Expect.REFUSED
    return Expect.SERVED if gen.conforms(ref(SERVABLE + endpoint.schema), value) else Expect.EITHER


def valid_body(gen: SchemaGen, endpoint: Endpoint, rng: random.Random) -> Body:
    value = gen.valid(ref(SERVABLE + endpoint.schema), rng)
    if rng.random() < 0.3:  # streams are what most clients ask for: more of them than the schema's share
        value["stream"] = True
    return Body(endpoint, value, "valid")


def _narrow(schema: Schema, props: Mapping[str, Schema]) -> Schema:
    """`schema` with some properties replaced; max_tokens required, so that no request runs to the context."""
    required = [*schema.get("required", ()), *(["max_tokens"] if "max_tokens" in props else [])]
    return {**schema, "properties": {**schema["properties"], **props}, "required": required}


def _int(lo: int, hi: int) -> Schema:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _num(lo: float, hi: float) -> Schema:
    return {"type": "number", "minimum": lo, "maximum": hi}


def _opt(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _text(lo: int, hi: int) -> Schema:
    return {"type": "string", "minLength": lo, "maxLength": hi}


def _array(items: Schema, lo: int, hi: int) -> Schema:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


NULL: Schema = {"type": "null"}


def _servable(model: str) -> dict[str, dict[str, Schema]]:
    """The properties the server accepts only in part (SamplingParams' ranges, unsupported features)."""
    common = _servable_common(model)
    token_ids = _array(_int(0, 1000), 1, 8)
    prompt = {"anyOf": [_text(1, 40), _array(_text(1, 12), 1, 3), token_ids, _array(token_ids, 1, 3)]}
    text_part = {"type": "object", "properties": {"type": {"const": "text"}, "text": _text(0, 200)},
                 "required": ["type", "text"]}
    content = {"anyOf": [_text(0, 200), NULL, _array(text_part, 0, 3)]}
    return {
        "CompletionRequest": {**common, "prompt": prompt, "logprobs": _opt(_int(0, 5)),
                              "echo": {"enum": [False, None]}, "suffix": NULL, "best_of": NULL},
        "ChatRequest": {**common, "messages": _array(ref(SERVABLE + "ChatMessage"), 1, 3),
                        "max_completion_tokens": _opt(_int(1, 16)), "top_logprobs": {"enum": [None, 0]},
                        "tools": _opt(_array({}, 0, 0)),
                        "tool_choice": {"enum": [None, "none"]}},  # a forced call needs tools
        # a tool result must answer a call of the assistant message before it (OpenAI's order): none generated
        "ChatMessage": {"content": content, "role": {"enum": ["system", "developer", "user", "assistant"]},
                        "tool_calls": NULL},
    }


def _servable_common(model: str) -> dict[str, Schema]:
    return {
        "model": {"anyOf": [NULL, {"const": model}]},
        "n": _int(1, 2),
        "max_tokens": _int(1, 16),
        "min_tokens": _int(0, 1),
        "temperature": _opt(_num(0, 2)),
        "top_p": _opt({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": _opt(_int(-1, 50)),
        "min_p": _opt(_num(0, 1)),
        "presence_penalty": _opt(_num(-2, 2)),
        "frequency_penalty": _opt(_num(-2, 2)),
        "repetition_penalty": _opt(_num(0.5, 2)),
        "stop": _opt({"anyOf": [_text(1, 8), _array(_text(1, 8), 0, 4)]}),
        "stop_token_ids": _opt(_array(_int(0, 1000), 0, 4)),
        "logit_bias": NULL,
        # one constraint at most, and a choice list is the one any strings make a valid grammar of
        "response_format": _opt({"type": "object", "properties": {"type": {"const": "text"}}, "required": ["type"]}),
        "guided_json": NULL, "guided_regex": NULL, "guided_grammar": NULL,
        "guided_choice": _opt(_array(_text(1, 8), 1, 3)),
    }


def narrowed_fields(gen: SchemaGen, endpoint: Endpoint) -> list[str]:
    """The top-level fields whose servable schema is narrower than the decoded one."""
    loose = gen.resolve(ref(endpoint.schema))["properties"]
    narrow = gen.resolve(ref(SERVABLE + endpoint.schema))["properties"]
    return sorted(name for name, schema in narrow.items() if schema != loose[name])
