"""The request fuzzer against an in-process server with an API key: a few hundred generated cases meet every
target (no 5xx, OpenAI error JSON, well-formed streams, the canary unchanged, nothing left running), and so
does each protocol case, except those listed in PENDING with what the server does with them today."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from yarl import URL

from backends.model.loader import ModelFiles
from bench.reliability.fuzz import Options, fuzz
from bench.reliability.fuzz_cases import WEIGHTS
from bench.reliability.fuzz_report import render
from bench.reliability.fuzz_wire import exchange, problems
from bench.reliability.protocol_cases import ProtocolCase, protocol_cases
from service.config import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config

KEY = "fuzz-test-key"
NAMES = [case.name for case in protocol_cases("127.0.0.1:0", KEY)]
TEXT_PLAIN = "aiohttp answers an unparsable request itself, with a text/plain 400"
PENDING: dict[str, str] = {
    **{name: TEXT_PLAIN for name in (
        "garbage line", "method only", "http/2 preface", "http/9.9 version", "https scheme version",
        "version not a number", "extra token in request line", "nul in request line", "tab separators",
        "request line of 100 KiB", "tls client hello", "nul bytes", "method with parenthesis", "non-ascii method",
        "lowercase method", "bare lf line endings", "header without colon", "header name with space",
        "space before colon", "empty header name", "obsolete line folding", "nul in header value",
        "cr in header value", "two host headers", "no host header", "content-length -1", "content-length abc",
        "content-length +n", "content-length hex", "content-length n, n", "content-length n, n+1",
        "content-length overflow", "content-length 1e2", "content-length empty", "two different content-lengths",
        "two equal content-lengths", "content-length shorter than the body", "chunk size not hex",
        "negative chunk size", "chunk size overflow", "chunk longer than its size", "chunked and content-length",
        "chunked, gzip", "unknown transfer-encoding", "two transfer-encoding headers", "target '/v1/models/ÿþ'",
        "target 'health'", "a get pipelined with garbage", "authorization b'Bearer a\\x00b'",
        *(f"FROB {route}" for route in ("/v1/completions", "/v1/chat/completions", "/v1/models",
                                         "/v1/models/some-model", "/health", "/metrics", "/no/such/route")))},
    **{name: "aiohttp's header limits answer with a text/plain 400" for name in (
        "header value of 64 KiB", "header value of 9 KiB", "header name of 9 KiB", "200 headers", "5000 headers")},
    "unknown expectation": "aiohttp answers an unknown Expect with a text/plain 417",
    **{f"content-encoding {c} on a plain body": "the body fails to inflate: a 500" for c in ("gzip", "deflate")},
    **{f"content-encoding {c} on a plain body": "aiohttp cannot decode it: a text/plain 400" for c in ("br", "zstd")},
    **{f"authorization {v!r}": "a key check of bytes that are not UTF-8: a 500"
       for v in (b"Bearer caf\xe9", b"Bearer \xff\xfe\xfd", b"Bearer \xc3(")},
    **{name: "answered with a status line of the request's HTTP version" for name in (
        "http/0.9 request", "http/0.9 version", "http/2.0 version")},
}


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    live = LiveServer.start(sim_config(ServiceConfig(port=0, api_keys=(KEY,))), cached_builder(model_files))
    yield live
    live.close()


@pytest.fixture(scope="module")
def cases(server: LiveServer) -> dict[str, ProtocolCase]:
    url = URL(server.url)
    return {case.name: case for case in protocol_cases(f"{url.host}:{url.port}", KEY)}


def test_there_are_enough_protocol_cases() -> None:
    assert len(NAMES) >= 100 and len(set(NAMES)) == len(NAMES)
    assert set(PENDING) <= set(NAMES)


def test_generated_cases_meet_every_target(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    opts = Options(cases=400, seed=11, api_key=KEY, concurrency=8, exclude=("deep_nesting",), protocol=False)
    summary = asyncio.run(fuzz(opts, server.url))
    assert summary.generated.sent == 400 and summary.canary.checks >= 2
    assert summary.passed, render(summary)
    assert not [r for r in caplog.records if r.exc_info], "the server logged a traceback"


@pytest.mark.xfail(reason="JSON nested deeper than the decoder's recursion limit is a 500 (RecursionError)")
def test_deeply_nested_bodies_meet_every_target(server: LiveServer) -> None:
    only_deep = tuple(kind for kind in WEIGHTS if kind != "deep_nesting")
    opts = Options(cases=30, seed=5, api_key=KEY, concurrency=4, exclude=only_deep, protocol=False)
    summary = asyncio.run(fuzz(opts, server.url))
    assert summary.passed, render(summary)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(reason=PENDING[name]))
                                  if name in PENDING else name for name in NAMES])
def test_protocol_case(server: LiveServer, cases: dict[str, ProtocolCase], name: str) -> None:
    url, case = URL(server.url), cases[name]
    result = asyncio.run(exchange(url.host or "", url.port or 0, case, timeout_s=5.0))
    found = problems(case, result)
    assert not found, f"{found}: {[(r.status, r.body[:200]) for r in result.responses]} [{result.ending}]"
