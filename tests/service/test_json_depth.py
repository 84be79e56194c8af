"""The nesting-depth scan that keeps deep JSON away from the decoder: exact on valid JSON, blind to brackets
in strings, linear on adversarial input; and the decoder's own RecursionError as a 400 behind it."""

from __future__ import annotations

import json
import time

import pytest

from service.http.body import decode, exceeds_depth, nesting_depth
from service.openai.errors import APIError
from service.openai.schemas.requests import ChatRequest


@pytest.mark.parametrize(("value", "depth"), [
    (1, 0), ("[{", 0), ([], 1), ({}, 1), ([[1], [2, [3]]], 3), ({"a": [{"b": "]]]]"}]}, 3),
    ([["x\\\"[", {"k": "\\"}]], 3), ({"a": "\"{[\\\\"}, 1),
])
def test_depth_of_valid_json(value: object, depth: int) -> None:
    assert nesting_depth(json.dumps(value).encode()) == depth


def test_unterminated_string_and_empty_text() -> None:
    assert nesting_depth(b'["abc [[[[') == 1 and nesting_depth(b"") == 0


def test_exceeds_depth_at_the_limit() -> None:
    assert not exceeds_depth(b"[" * 64 + b"]" * 64, 64)
    assert exceeds_depth(b"[" * 65 + b"]" * 65, 64)
    assert not exceeds_depth(json.dumps([[1]] * 1000).encode(), 64)  # many brackets, shallow


@pytest.mark.parametrize("text", [b"[" * 2_000_000, b'"' + b'\\"' * 1_000_000, b'["\\' * 700_000,
                                  b'[["a"],' * 250_000])
def test_adversarial_text_is_scanned_in_linear_time(text: bytes) -> None:
    start = time.perf_counter()
    exceeds_depth(text, 128)
    assert time.perf_counter() - start < 2.0  # a quadratic scan of 2 MB would take hours


def test_the_decoders_recursion_error_is_a_400() -> None:
    body = b'{"messages": [{"role": "user"}], "guided_json": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with pytest.raises(APIError) as raised:
        decode(body, ChatRequest)
    assert raised.value.status == 400 and raised.value.code == "nesting_too_deep"
