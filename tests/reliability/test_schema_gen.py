"""The fuzzer's schema walker: every value it calls valid decodes into the request Structs (and the servable
ones pass the server's own checks); its conformance check agrees with msgspec on mutated bodies and on
arbitrary JSON; what it labels refused is refused."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.reliability.fuzz_bodies import (
    CHAT,
    COMPLETIONS,
    ENDPOINTS,
    SERVABLE,
    Endpoint,
    Expect,
    expectation,
    ref,
    request_gen,
    valid_body,
)
from bench.reliability.fuzz_bytes import BYTE_MUTATIONS
from bench.reliability.fuzz_cases import CaseMaker
from bench.reliability.fuzz_mutations import MUTATIONS
from bench.reliability.schema_gen import BadToken, SchemaGen, encode
from service.openai.params import chat_params, completion_params
from service.openai.schemas.requests import ChatRequest, CompletionRequest

MODEL = "the-model"
STRUCTS: dict[Endpoint, type[Any]] = {COMPLETIONS: CompletionRequest, CHAT: ChatRequest}
SEEDS = range(150)


@pytest.fixture(scope="module")
def gen() -> SchemaGen:
    return request_gen(MODEL)


def decodes(endpoint: Endpoint, raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw, type=STRUCTS[endpoint])
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.schema)
def test_valid_values_decode_into_the_request_structs(gen: SchemaGen, endpoint: Endpoint) -> None:
    for seed in SEEDS:
        value = gen.valid(ref(endpoint.schema), random.Random(seed))
        assert gen.conforms(ref(endpoint.schema), value)
        assert decodes(endpoint, encode(value)), value


def test_servable_values_pass_the_servers_checks(gen: SchemaGen) -> None:
    for seed in SEEDS:
        for endpoint in ENDPOINTS:
            value = valid_body(gen, endpoint, random.Random(seed)).value
            assert gen.conforms(ref(endpoint.schema), value)  # a narrowing: nothing msgspec would refuse
            assert expectation(gen, endpoint, value) is Expect.SERVED
            req = msgspec.json.decode(encode(value), type=STRUCTS[endpoint])
            params = completion_params(req) if endpoint is COMPLETIONS else chat_params(req)
            assert params.max_tokens is not None and params.max_tokens <= 16


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_a_mutation_is_refused_exactly_when_the_schema_says_so(gen: SchemaGen, kind: str) -> None:
    refused = 0
    for seed in SEEDS:
        rng = random.Random(seed)
        endpoint = rng.choice(ENDPOINTS)
        value = MUTATIONS[kind](gen, endpoint, valid_body(gen, endpoint, rng).value, rng)
        should_refuse = expectation(gen, endpoint, value) is Expect.REFUSED
        assert decodes(endpoint, encode(value)) is not should_refuse, encode(value)[:500]
        refused += should_refuse
    assert refused > 0, f"{kind} never made a body the decoder refuses"


@pytest.mark.parametrize("kind", sorted(set(BYTE_MUTATIONS) - {"oversized"}))  # oversized: refused by size
def test_bodies_broken_below_json_that_must_be_refused_do_not_decode(gen: SchemaGen, kind: str) -> None:
    for seed in range(40):
        rng = random.Random(seed)
        body = valid_body(gen, rng.choice(ENDPOINTS), rng)
        raw, expect = BYTE_MUTATIONS[kind](body.endpoint, body.value, rng)
        if expect is Expect.REFUSED:
            assert not decodes(body.endpoint, raw), raw[:300]
        elif expect is None:
            assert decodes(body.endpoint, raw), raw[:300]


def test_a_case_is_rebuilt_from_its_seed_and_index(gen: SchemaGen) -> None:
    maker = CaseMaker(gen, MODEL)
    assert [maker.case(7, i) for i in (3, 99)] == [c for i, c in enumerate(maker.cases(7, 100)) if i in (3, 99)]
    assert {c.kind for c in maker.cases(1, 400)} >= {"valid", "wrong_value", "truncated", "get"}


def test_bad_tokens_are_written_verbatim_and_conform_to_nothing(gen: SchemaGen) -> None:
    assert encode({"temperature": BadToken(b"NaN")}) == b'{"temperature":NaN}'
    assert not gen.conforms({}, [BadToken(b"1e999")])


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
FIELDS = ("n", "stop", "prompt", "stream_options", "logit_bias", "metadata", "stop_token_ids", "seed")


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=JSON)
def test_conformance_agrees_with_msgspec_on_any_json(field: str, value: Any) -> None:
    gen = request_gen(MODEL)
    body = {"prompt": "x", field: value}
    assert gen.conforms(ref(COMPLETIONS.schema), body) is decodes(COMPLETIONS, encode(body))
    assert not gen.conforms(ref(SERVABLE + COMPLETIONS.schema), body) or decodes(COMPLETIONS, encode(body))
