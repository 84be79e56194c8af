"""The generated HTTP cases: a weighted mix of valid bodies, mutated bodies, broken bytes and GETs. Case i of
seed s draws from its own random stream, so any one case can be rebuilt from (s, i) alone."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from bench.reliability.fuzz_bodies import ENDPOINTS, Body, Expect, expectation, valid_body
from bench.reliability.fuzz_bytes import BYTE_MUTATIONS
from bench.reliability.fuzz_mutations import MUTATIONS
from bench.reliability.schema_gen import SchemaGen, encode


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    kind: str
    method: str
    path: str
    body: bytes | None
    expect: Expect
    stream: bool = False  # asked for an SSE stream

    @property
    def route(self) -> str:
        path = "/v1/models/{model}" if self.path.startswith("/v1/models/") else self.path
        return f"{self.method} {path}"


@dataclass(frozen=True)
class CaseMaker:
    gen: SchemaGen
    model: str  # the served model's name
    weights: Mapping[str, float] = field(default_factory=lambda: WEIGHTS)  # how often each kind comes

    def cases(self, seed: int, count: int) -> Iterator[Case]:
        return (self.case(seed, i) for i in range(count))

    def case(self, seed: int, index: int) -> Case:
        rng = random.Random(f"{seed}:{index}")
        kind = rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
        return BUILDERS.get(kind, _json_mutation)(self, kind, rng, seed, index)


def _post(body: Body, raw: bytes, expect: Expect, seed: int, index: int) -> Case:
    stream = isinstance(body.value, dict) and body.value.get("stream") is True
    return Case(seed, index, body.kind, "POST", body.endpoint.path, raw, expect, stream)


Builder = Callable[[CaseMaker, str, random.Random, int, int], Case]


def _valid(maker: CaseMaker, kind: str, rng: random.Random, seed: int, index: int) -> Case:
    body = valid_body(maker.gen, rng.choice(ENDPOINTS), rng)
    return _post(body, encode(body.value), Expect.SERVED, seed, index)


def _json_mutation(maker: CaseMaker, kind: str, rng: random.Random, seed: int, index: int) -> Case:
    endpoint = rng.choice(ENDPOINTS)
    value = MUTATIONS[kind](maker.gen, endpoint, valid_body(maker.gen, endpoint, rng).value, rng)
    return _post(Body(endpoint, value, kind), encode(value), expectation(maker.gen, endpoint, value),
                       seed, index)


def _byte_mutation(maker: CaseMaker, kind: str, rng: random.Random, seed: int, index: int) -> Case:
    body = valid_body(maker.gen, rng.choice(ENDPOINTS), rng)
    raw, expect = BYTE_MUTATIONS[kind](body.endpoint, body.value, rng)
    return _post(Body(body.endpoint, body.value, kind), raw, expect or Expect.SERVED, seed, index)


def _get(maker: CaseMaker, kind: str, rng: random.Random, seed: int, index: int) -> Case:
    known = ["/v1/models", "/health", "/metrics", f"/v1/models/{quote(maker.model, safe='')}"]
    if rng.random() < 0.8:
        return Case(seed, index, kind, "GET", rng.choice(known), None, Expect.SERVED)
    unknown = quote(maker.gen.text(rng, 1, 16), safe="") + "-unknown"
    return Case(seed, index, kind, "GET", f"/v1/models/{unknown}", None, Expect.REFUSED)


def _wrong_method(maker: CaseMaker, kind: str, rng: random.Random, seed: int, index: int) -> Case:
    method, path = rng.choice([("GET", "/v1/completions"), ("GET", "/v1/chat/completions"),
                               ("POST", "/v1/models"), ("POST", "/health"), ("DELETE", "/v1/completions"),
                               ("PUT", "/v1/chat/completions"), ("PATCH", "/v1/models")])
    body: Any = encode(valid_body(maker.gen, rng.choice(ENDPOINTS), rng).value) if method != "GET" else None
    return Case(seed, index, kind, method, path, body, Expect.REFUSED)


# Mostly valid bodies, so the server really generates while it is being fed the rest.
WEIGHTS: dict[str, float] = {
    "valid": 45.0,
    "wrong_value": 6.0, "unknown_field": 4.0, "missing_required": 3.0, "out_of_range": 6.0, "empty_values": 3.0,
    "odd_string": 4.0, "non_finite": 2.0,
    "truncated": 2.5, "trailing_garbage": 1.5, "random_bytes": 2.0, "non_object": 1.5, "duplicate_key": 1.5,
    "bad_utf8": 1.5, "padded": 1.0, "byte_order_mark": 0.5, "deep_nesting": 2.0, "oversized": 0.3,
    "get": 7.0, "wrong_method": 2.0,
}
BUILDERS: dict[str, Builder] = {"valid": _valid, "get": _get, "wrong_method": _wrong_method,
                                **{name: _byte_mutation for name in BYTE_MUTATIONS}}
