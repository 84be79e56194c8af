"""The request fuzzer against an in-process server with an API key: a few hundred generated cases meet every
target (no 5xx, OpenAI error JSON, well-formed streams, the canary unchanged, nothing left running), and so
does each protocol case."""

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
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config

KEY = "fuzz-test-key"
NAMES = [case.name for case in protocol_cases("127.0.0.1:0", KEY)]


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


def test_generated_cases_meet_every_target(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    opts = Options(cases=400, seed=11, api_key=KEY, concurrency=8, exclude=("deep_nesting",), protocol=False)
    summary = asyncio.run(fuzz(opts, server.url))
    assert summary.generated.sent == 400 and summary.canary.checks >= 2
    assert summary.passed, render(summary)
    assert not [r for r in caplog.records if r.exc_info], "the server logged a traceback"


def test_deeply_nested_bodies_meet_every_target(server: LiveServer) -> None:
    only_deep = tuple(kind for kind in WEIGHTS if kind != "deep_nesting")
    opts = Options(cases=30, seed=5, api_key=KEY, concurrency=4, exclude=only_deep, protocol=False)
    summary = asyncio.run(fuzz(opts, server.url))
    assert summary.passed, render(summary)


@pytest.mark.parametrize("name", NAMES)
def test_protocol_case(server: LiveServer, cases: dict[str, ProtocolCase], name: str) -> None:
    url, case = URL(server.url), cases[name]
    result = asyncio.run(exchange(url.host or "", url.port or 0, case, timeout_s=5.0))
    found = problems(case, result)
    assert not found, f"{found}: {[(r.status, r.body[:200]) for r in result.responses]} [{result.ending}]"
