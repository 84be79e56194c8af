"""Values for the JSON Schemas msgspec emits: ones that conform, ones that do not, and the conformance check
that tells them apart (so a mutated body's expected fate comes from the schema, not from a guess).

The subset handled: `$ref` into `$defs`, `anyOf`, `const`/`enum`, `type` (null, boolean, integer, number,
string, array, object), `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `minLength`/`maxLength`,
`pattern` (of character-class shape: a value keeps the characters that match it alone),
`items`/`minItems`/`maxItems`, `properties`/`required`/`additionalProperties`, and `{}` (msgspec's Any)."""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

Schema = Mapping[str, Any]
REF_PREFIX = "#/$defs/"
PLAIN = string.ascii_letters + string.digits + " .,!?-_'\n"
# One code point each (lengths are counted in code points): accents, CJK, astral emoji, RTL mark and
# override, NUL, BOM, a combining accent, a noncharacter, the last code point, JSON's escaped characters.
ODD = ("é", "ß", "中", "語", "🙂", "\U0001f9ea", "\u200f", "\u202e", "\u0000", "\ufeff", "\u0301", "\uffff",
       "\U0010ffff", "\t", "\\", '"', "/")


class BadToken:
    """JSON text written verbatim that no schema accepts: not JSON at all (NaN, Infinity, a lone surrogate
    escape) or a number msgspec refuses (1e999). Not a dataclass: msgspec would encode that as an object."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"BadToken({self.text!r})"


BAD_TOKENS = tuple(BadToken(t) for t in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"))


@dataclass(frozen=True)
class Limits:
    """How big generated values get: small, so that valid requests are cheap to serve."""

    max_items: int = 3
    max_chars: int = 12
    max_depth: int = 3  # of values generated for Any
    optional_share: float = 0.3  # the chance that an optional property is present
    span: int = 1000  # unbounded numbers are drawn from [-span, span]
    edge_share: float = 0.15  # the chance that a bounded number is one of its bounds
    odd_share: float = 0.1  # the chance that a character of a string comes from ODD


def encode(value: Any) -> bytes:
    """JSON bytes of a generated value, BadTokens written as they are."""
    return msgspec.json.encode(value, enc_hook=_raw)


def _raw(obj: Any) -> msgspec.Raw:
    if isinstance(obj, BadToken):
        return msgspec.Raw(obj.text)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


@dataclass(frozen=True)
class SchemaGen:
    defs: Mapping[str, Schema]
    limits: Limits = Limits()

    def resolve(self, schema: Schema) -> Schema:
        while "$ref" in schema:
            schema = self.defs[schema["$ref"].removeprefix(REF_PREFIX)]
        return schema

    def valid(self, schema: Schema, rng: random.Random, depth: int = 0) -> Any:
        schema = self.resolve(schema)
        if "anyOf" in schema:
            return self.valid(rng.choice(schema["anyOf"]), rng, depth)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        kind = schema.get("type")
        if kind is None:
            return self.any_value(rng, depth)
        return _MAKERS[kind](self, schema, rng, depth)

    def invalid(self, schema: Schema, rng: random.Random) -> Any:
        """A value that does not conform to `schema` (a wrong type, a number past a bound, a bad token...)."""
        pool = [v for v in self._candidates(schema, rng) if not self.conforms(schema, v)]
        return rng.choice(pool)

    def conforms(self, schema: Schema, value: Any) -> bool:
        schema = self.resolve(schema)
        if "anyOf" in schema:
            return any(self.conforms(s, value) for s in schema["anyOf"])
        if "const" in schema:
            return _same(value, schema["const"])
        if "enum" in schema:
            return any(_same(value, e) for e in schema["enum"])
        kind = schema.get("type")
        return is_json(value) if kind is None else _CHECKS[kind](self, schema, value)

    def any_value(self, rng: random.Random, depth: int) -> Any:
        """A JSON value of any type, nested no deeper than limits.max_depth."""
        kinds = ["null", "boolean", "integer", "number", "string"]
        kind = rng.choice(kinds + (["array", "object"] if depth < self.limits.max_depth else []))
        if kind == "array":
            return [self.any_value(rng, depth + 1) for _ in range(rng.randint(0, self.limits.max_items))]
        if kind == "object":
            return {self.text(rng, 0, 8): self.any_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
        return self.valid({"type": kind}, rng, depth)

    def text(self, rng: random.Random, shortest: int, longest: int) -> str:
        odd = self.limits.odd_share
        length = rng.randint(shortest, max(shortest, longest))
        return "".join(rng.choice(ODD) if rng.random() < odd else rng.choice(PLAIN) for _ in range(length))

    def _candidates(self, schema: Schema, rng: random.Random) -> list[Any]:
        """Values of every JSON type and the numbers just past `schema`'s bounds."""
        schema = self.resolve(schema)
        wrong = [None, True, 0, -1, 1.5, 1.0, 2**70, -(2**70), "", "x", [], [1.5], {}, {"": None}, *BAD_TOKENS]
        bounds = [b for branch in schema.get("anyOf", [schema]) for b in _past_bounds(self.resolve(branch))]
        return wrong + bounds + [self.any_value(rng, 0)]

    def _integer(self, schema: Schema, rng: random.Random, depth: int) -> int:
        lo, hi = _bounds(schema, self.limits.span, integer=True)
        if rng.random() < self.limits.edge_share:
            return int(rng.choice((lo, hi)))
        start = min(max(lo, -self.limits.span), hi)
        return rng.randint(int(start), int(max(min(hi, self.limits.span), start)))

    def _number(self, schema: Schema, rng: random.Random, depth: int) -> float:
        lo, hi = _bounds(schema, self.limits.span, integer=False)
        edges = [schema[k] for k in ("minimum", "maximum") if k in schema]
        value = rng.choice(edges) if edges and rng.random() < self.limits.edge_share else rng.uniform(lo, hi)
        if rng.random() < 0.2 and self.conforms(schema, round(value)):
            return round(value)  # a JSON integer where a number is expected is still a number
        return value if self.conforms(schema, value) else (lo + hi) / 2

    def _string(self, schema: Schema, rng: random.Random, depth: int) -> str:
        shortest = schema.get("minLength", 0)
        text = self.text(rng, shortest, min(schema.get("maxLength", math.inf), self.limits.max_chars))
        if "pattern" not in schema:
            return text
        kept = "".join(c for c in text if re.search(schema["pattern"], c))
        return kept + "a" * max(0, shortest - len(kept))

    def _array(self, schema: Schema, rng: random.Random, depth: int) -> list[Any]:
        shortest = schema.get("minItems", 0)
        count = rng.randint(shortest, max(shortest, min(schema.get("maxItems", math.inf), self.limits.max_items)))
        return [self.valid(schema.get("items", {}), rng, depth + 1) for _ in range(count)]

    def _object(self, schema: Schema, rng: random.Random, depth: int) -> dict[str, Any]:
        props, required = schema.get("properties", {}), set(schema.get("required", ()))
        out = {k: self.valid(s, rng, depth + 1) for k, s in props.items()
               if k in required or rng.random() < self.limits.optional_share}
        extra = schema.get("additionalProperties", True)
        if isinstance(extra, Mapping) or (extra is True and not props):
            extra_schema = extra if isinstance(extra, Mapping) else {}
            for _ in range(rng.randint(0, self.limits.max_items)):
                out.setdefault(self.text(rng, 1, 8), self.valid(extra_schema, rng, depth + 1))
        return out


def _bounds(schema: Schema, span: int, integer: bool) -> tuple[float, float]:
    """The inclusive range of a numeric schema (exclusive integer bounds moved in by one)."""
    step = 1 if integer else 0
    lo = schema.get("minimum", schema.get("exclusiveMinimum", -span - step) + step)
    hi = schema.get("maximum", schema.get("exclusiveMaximum", span + step) - step)
    return lo, hi


def _past_bounds(schema: Schema) -> list[Any]:
    """Values just outside a schema's bounds: one past a number's, one longer or shorter than allowed."""
    kind, out = schema.get("type"), []
    if "minimum" in schema:
        out.append(schema["minimum"] - 1)
    if "maximum" in schema:
        out.append(schema["maximum"] + 1)
    out += [schema[k] for k in ("exclusiveMinimum", "exclusiveMaximum") if k in schema]
    if kind == "string":
        out += ["x" * (schema["maxLength"] + 1)] if "maxLength" in schema else []
        out += [""] if schema.get("minLength", 0) > 0 else []
    if kind == "array" and "maxItems" in schema:
        out.append([None] * (schema["maxItems"] + 1))
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    return type(a) is type(b) and a == b


def is_json(value: Any) -> bool:
    """Whether msgspec decodes `value`'s encoding into Any (finite numbers, string keys, no bad tokens)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_json(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, bool | int | str)


def _number_ok(schema: Schema, value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) or not isinstance(value, kinds) or not is_json(value):
        return False
    return (value >= schema.get("minimum", -math.inf) and value <= schema.get("maximum", math.inf)
            and value > schema.get("exclusiveMinimum", -math.inf) and value < schema.get("exclusiveMaximum", math.inf))


def _array_ok(gen: SchemaGen, schema: Schema, value: Any) -> bool:
    return (isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf)
            and all(gen.conforms(schema.get("items", {}), v) for v in value))


def _object_ok(gen: SchemaGen, schema: Schema, value: Any) -> bool:
    if not isinstance(value, dict) or not set(schema.get("required", ())) <= set(value):
        return False
    props, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
    return all(gen.conforms(props[k], v) if k in props else _extra_ok(gen, extra, k, v) for k, v in value.items())


def _extra_ok(gen: SchemaGen, extra: bool | Schema, key: Any, value: Any) -> bool:
    if not isinstance(key, str) or extra is False:
        return False
    return is_json(value) if extra is True else gen.conforms(extra, value)


Check = Callable[[SchemaGen, Schema, Any], bool]
_CHECKS: dict[str, Check] = {
    "null": lambda gen, schema, v: v is None,
    "boolean": lambda gen, schema, v: isinstance(v, bool),
    "integer": lambda gen, schema, v: _number_ok(schema, v, (int,)),
    "number": lambda gen, schema, v: _number_ok(schema, v, (int, float)),
    "string": lambda gen, schema, v: isinstance(v, str)
    and schema.get("minLength", 0) <= len(v) <= schema.get("maxLength", math.inf)
    and ("pattern" not in schema or re.search(schema["pattern"], v) is not None),
    "array": _array_ok,
    "object": _object_ok,
}
Maker = Callable[[SchemaGen, Schema, random.Random, int], Any]
_MAKERS: dict[str, Maker] = {
    "null": lambda gen, schema, rng, depth: None,
    "boolean": lambda gen, schema, rng, depth: rng.random() < 0.5,
    "integer": SchemaGen._integer,
    "number": SchemaGen._number,
    "string": SchemaGen._string,
    "array": SchemaGen._array,
    "object": SchemaGen._object,
}
