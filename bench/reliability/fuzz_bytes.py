"""Request bodies broken below the level of JSON values: truncated, padded, with trailing garbage, duplicate
keys, invalid UTF-8, random bytes, another top-level type, nesting deeper than a decoder's stack, a body over
the size limit. Each returns the bytes to send and what the server must do with them (None: whatever it must
do with the unbroken value)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from bench.reliability.fuzz_bodies import CHAT, Endpoint, Expect
from bench.reliability.fuzz_mutations import replace
from bench.reliability.schema_gen import encode

Broken = tuple[bytes, Expect | None]
ByteMutation = Callable[[Endpoint, Any, random.Random], Broken]
MARK = "\u0001nested\u0001"  # a placeholder string, replaced by the nested JSON text after encoding
BAD_UTF8 = (b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80")
OVERSIZED_CHARS = 2_600_000  # over the default 2 MiB body limit


def truncated(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    raw = encode(value)
    return raw[:rng.randrange(len(raw))], Expect.REFUSED


def trailing_garbage(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    return encode(value) + rng.choice([b"}", b"x", b",{}", b"\x00", b"{}", b"]"]), Expect.REFUSED


def random_bytes(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    return rng.randbytes(rng.randint(0, 256)), Expect.REFUSED


def non_object(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    return encode(rng.choice([[], [value], list(value), "prompt", 42, None, True, 1.5, ""])), Expect.REFUSED


def duplicate_key(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    """A key written twice, a different value first: decoders keep the last one, or refuse; both are fine."""
    key = rng.choice(list(value))
    first = encode(rng.choice([None, "dup", -1, [], {}, 2**70]))
    return b"{" + encode(key) + b":" + first + b"," + encode(value)[1:], Expect.EITHER


def bad_utf8(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    raw, bad = encode(value), rng.choice(BAD_UTF8)
    start = raw.find(b':"') + 2  # into the first string value (1 when there is none: into the first key)
    return raw[:start] + bad + raw[start:], Expect.REFUSED


def padded(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    return b" \r\n\t" + encode(value) + b"\n\n ", None


def byte_order_mark(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    return b"\xef\xbb\xbf" + encode(value), Expect.EITHER


def deep_nesting(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    """Arrays or objects nested up to 100,000 deep in a field that takes any JSON (or one that does not)."""
    depth = rng.choice([16, 128, 512, 999, 1000, 5000, 100_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    slots = [("tool_choice",), ("messages", 0, "tool_calls"), ("tools",)] if endpoint is CHAT else [("prompt",)]
    marked = replace(value, rng.choice([*slots, ("metadata",), ("stop",)]), MARK)
    return encode(marked).replace(encode(MARK), opener * depth + b"1" + closer * depth), Expect.EITHER


def oversized(endpoint: Endpoint, value: Any, rng: random.Random) -> Broken:
    text = "x " * (OVERSIZED_CHARS // 2)
    if endpoint is CHAT:
        return encode({**value, "messages": [{"role": "user", "content": text}]}), Expect.REFUSED
    return encode({**value, "prompt": text}), Expect.REFUSED


BYTE_MUTATIONS: dict[str, ByteMutation] = {
    "truncated": truncated,
    "trailing_garbage": trailing_garbage,
    "random_bytes": random_bytes,
    "non_object": non_object,
    "duplicate_key": duplicate_key,
    "bad_utf8": bad_utf8,
    "padded": padded,
    "byte_order_mark": byte_order_mark,
    "deep_nesting": deep_nesting,
    "oversized": oversized,
}
