"""The fuzzer's judges: the error shape and stream checks, the protocol verdict, the canary's tally and the
log's tracebacks, on answers written by hand."""

from __future__ import annotations

import pytest

from bench.reliability.fuzz_canary import CanaryLog
from bench.reliability.fuzz_checks import error_problems, stream_problems
from bench.reliability.fuzz_state import logged_exceptions
from bench.reliability.fuzz_wire import ANSWERED, CLOSED, NO_ANSWER, Exchange, RawResponse, problems
from bench.reliability.protocol_cases import ProtocolCase
from service.openai.schemas.responses import CompletionChunk

JSON = "application/json"
ERROR = b'{"error": {"message": "no", "type": "invalid_request_error", "param": null, "code": null}}'
CHUNK = b'{"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": []}'


@pytest.mark.parametrize(("content_type", "body", "problem"), [
    (JSON, ERROR, None),
    ("application/json; charset=utf-8", ERROR, None),
    ("text/plain; charset=utf-8", ERROR, "error sent as text/plain"),
    (JSON, b"Bad Request", "not JSON"),
    (JSON, b'{"error": "no"}', 'not {"error": {...}}'),
    (JSON, b'{"error": {"message": "no", "type": "t", "param": null}}', "error fields are"),
    (JSON, b'{"error": {"message": "no", "type": "t", "param": null, "code": null}, "x": 1}', "not {"),
    (JSON, b'{"error": {"message": "no", "type": "t", "param": 3, "code": null}}', "neither a string nor null"),
])
def test_an_error_must_be_exactly_openais_json(content_type: str, body: bytes, problem: str | None) -> None:
    found = error_problems(content_type, body)
    assert found == [] if problem is None else problem in found[0]


@pytest.mark.parametrize(("body", "problem"), [
    (b"data: " + CHUNK + b"\n\ndata: [DONE]\n\n", None),
    (b"data: " + CHUNK + b"\n\ndata: " + ERROR + b"\n\ndata: [DONE]\n\n", None),
    (b"data: " + CHUNK + b"\n\n", "does not end with data: [DONE]"),
    (b"data: [DONE]\n\ndata: [DONE]\n\n", "[DONE] before the end"),
    (b"data: " + CHUNK + b"\n\ndata: [DONE]\n\ndata: {", "ends inside an event"),
    (b'data: {"error": "boom"}\n\ndata: [DONE]\n\n', "in-band error body"),
    (b'data: {"choices": 1}\n\ndata: [DONE]\n\n', "chunk is not a CompletionChunk"),
])
def test_a_stream_must_end_with_done_and_carry_openai_json(body: bytes, problem: str | None) -> None:
    found = stream_problems(body, CompletionChunk)
    assert found == [] if problem is None else problem in found[0]


def answer(status: int, content_type: str = JSON, body: bytes = ERROR) -> RawResponse:
    return RawResponse(status, (("Content-Type", content_type),), body)


def test_the_protocol_verdict() -> None:
    case, head = ProtocolCase("c", (b"x",)), ProtocolCase("h", (b"x",), head=True)
    assert problems(case, Exchange((answer(400),), ANSWERED)) == []
    assert problems(case, Exchange((answer(500),), ANSWERED)) == ["500 from the server"]
    assert problems(head, Exchange((answer(405, body=b""),), ANSWERED)) == []
    assert problems(head, Exchange((answer(405, "text/plain", b""),), ANSWERED)) == ["error sent as text/plain"]
    assert problems(case, Exchange((), NO_ANSWER, "silence"))[0].startswith("no-answer")
    assert problems(case, Exchange((), CLOSED)) == ["closed after 0 of 1 answers"]
    assert problems(ProtocolCase("c", (b"x",), required=0), Exchange((), CLOSED)) == []
    assert problems(case, Exchange((RawResponse(200, (), b"", "HTTP/2.0"),), ANSWERED)) == [
        "a status line of HTTP/2.0"]


def test_the_canary_compares_with_its_first_good_answer() -> None:
    log = CanaryLog()
    log.record(None, "status 503", stream=False)
    log.record("a b c", "", stream=True)
    log.record("a b c", "", stream=False)
    log.record("a b d", "", stream=True)
    assert log.reference == "a b c" and log.checks == 4
    assert [m.split(":")[0] for m in log.mismatches] == ["check 1 (plain)", "check 4 (streamed)"]


def test_tracebacks_are_counted_by_the_exception_that_ends_them() -> None:
    log = ("Error handling request\nTraceback (most recent call last):\n  File \"a\", line 1\n    f()\n\n"
           "RecursionError: maximum recursion depth exceeded\nINFO done\n"
           "Traceback (most recent call last):\n  File \"b\"\nzlib.error: Error -3\n")
    assert logged_exceptions(log) == {"RecursionError": 1, "zlib.error": 1}
