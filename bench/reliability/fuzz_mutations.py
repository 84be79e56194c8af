"""Mutations of a valid request body's JSON value, each aimed at one rule: a value of the wrong type or past
a bound, an unknown field, a missing required one, a number the decoder allows but the server may not, empty
values, odd strings, non-finite numbers. Which of them the server must refuse is for the schemas to say."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from bench.reliability.fuzz_bodies import Endpoint, narrowed_fields, ref
from bench.reliability.schema_gen import BadToken, Schema, SchemaGen

Path = tuple[str | int, ...]
Node = tuple[Path, Schema]


def nodes(gen: SchemaGen, schema: Schema, value: Any, path: Path = ()) -> list[Node]:
    """Every value inside `value` with the schema that governs it (an anyOf's first matching branch)."""
    schema = gen.resolve(schema)
    if "anyOf" in schema:
        branch = next((s for s in schema["anyOf"] if gen.conforms(s, value)), None)
        return [(path, schema)] + ([] if branch is None else nodes(gen, branch, value, path)[1:])
    found: list[Node] = [(path, schema)]
    for key, child in _children(schema, value):
        found += nodes(gen, child, value[key], (*path, key))
    return found


def _children(schema: Schema, value: Any) -> list[tuple[str | int, Schema]]:
    if isinstance(value, list):
        return [(i, schema.get("items", {})) for i in range(len(value))]
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties", {})
        return [(k, props.get(k, extra if isinstance(extra, Mapping) else {})) for k in value]
    return []


def replace(value: Any, path: Path, new: Any) -> Any:
    """A copy of `value` with the value at `path` replaced (a JSON tree: dicts and lists)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replace(value.get(head), rest, new)}  # a missing last key is added
    return [replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


def at(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


Mutation = Callable[[SchemaGen, Endpoint, Any, random.Random], Any]


def wrong_value(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    """Some value inside the body replaced by one its schema does not allow (a wrong type, a bound passed)."""
    path, schema = rng.choice(nodes(gen, ref(endpoint.schema), value)[1:])
    return replace(value, path, gen.invalid(schema, rng))


def unknown_field(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    objects = [(p, s) for p, s in nodes(gen, ref(endpoint.schema), value) if isinstance(at(value, p), dict)]
    path, schema = rng.choice(objects)
    name = rng.choice(["temperatur", "__proto__", "", "maxTokens", "𝔭𝔯𝔬𝔪𝔭𝔱", "prompt ", gen.text(rng, 1, 10)])
    if name in schema.get("properties", {}):
        name += "_"
    return replace(value, path, {**at(value, path), name: gen.any_value(rng, 1)})


def missing_required(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    holders = [(p, k) for p, s in nodes(gen, ref(endpoint.schema), value) if isinstance(at(value, p), dict)
               for k in s.get("required", ()) if k in at(value, p)]
    path, key = rng.choice(holders)
    return replace(value, path, {k: v for k, v in at(value, path).items() if k != key})


def out_of_range(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    """A top-level field set to what its decoded type allows but the server may not (n = 0, 2**31 - 1...)."""
    name = rng.choice(narrowed_fields(gen, endpoint))
    loose = gen.resolve(gen.resolve(ref(endpoint.schema))["properties"][name])
    edges = [b[k] for b in loose.get("anyOf", [loose]) for k in ("minimum", "maximum") if k in b]
    return {**value, name: rng.choice([gen.valid(loose, rng), *edges, -1, 0, 17, 101, 2**31 - 1])}


def empty_values(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    """Strings, lists and objects inside the body emptied."""
    hollow = [p for p, _ in nodes(gen, ref(endpoint.schema), value)[1:] if isinstance(at(value, p), str | list | dict)]
    if not hollow:
        return value
    path = rng.choice(hollow)
    return replace(value, path, type(at(value, path))())


def odd_string(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    """A string inside the body replaced by a lone surrogate, control characters, bidi overrides or a long text."""
    strings = [p for p, _ in nodes(gen, ref(endpoint.schema), value) if isinstance(at(value, p), str)]
    if not strings:
        return value
    odd: list[Any] = [BadToken(b'"\\ud800"'), BadToken(b'"a\\udfffb"'), BadToken(b'"\\ud83d"'),
                      "\u0000" * 8, "\u202e\u202dabc\u200f", "🙂" * 200, "\r\n\r\n", "x" * rng.choice([4096, 70_000])]
    return replace(value, rng.choice(strings), rng.choice(odd))


def non_finite(gen: SchemaGen, endpoint: Endpoint, value: Any, rng: random.Random) -> Any:
    """A number field written as NaN, Infinity or a number too large for a double."""
    name = rng.choice(["temperature", "top_p", "min_p", "presence_penalty", "n", "max_tokens", "seed"])
    return {**value, name: BadToken(rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1E400", b"nan"]))}


MUTATIONS: dict[str, Mutation] = {
    "wrong_value": wrong_value,
    "unknown_field": unknown_field,
    "missing_required": missing_required,
    "out_of_range": out_of_range,
    "empty_values": empty_values,
    "odd_string": odd_string,
    "non_finite": non_finite,
}
