"""The server's traces in a real trace store: Arize Phoenix (tests/telemetry/phoenix.py) receives a 50-request
streamed run over OTLP/HTTP, with content recording on, and everything is read back through Phoenix's own REST
API: each request's LLM span with one token event per streamed token, its OpenInference and gen_ai.* attributes,
its prompt and completion; each engine step's span naming request spans that are in the store. Then Phoenix's own
web UI, in headless Chromium (tests/browser.py), lists the run's request spans as LLM spans."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig, TelemetrySettings
from tests.background import background_of
from tests.browser import chromium, screenshot
from tests.required import unavailable
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import request, sse_events
from tests.telemetry.phoenix import PHOENIX, Phoenix, start_phoenix
from tests.waiting import wait_until

STORE = "phoenix-store"
PROJECT = "pagedserve"  # the service name, which the spans' resource names as their OpenInference project
REQUESTS = 50


def start_in_background(session: pytest.Session) -> None:
    """Called when collection ends with this module's tests selected (tests/background.py): Phoenix's start-up
    (many seconds) overlaps the rest of the suite, and the test, which waits for it, runs last."""
    if PHOENIX.exists():
        background = background_of(session)
        background.start(STORE, start_phoenix, background.directory(STORE))


@pytest.fixture(scope="module")
def phoenix(request: pytest.FixtureRequest) -> Iterator[Phoenix]:
    if not PHOENIX.exists():
        unavailable("Arize Phoenix is not installed in .venv-phoenix (make phoenix-tools)",
                    "the Phoenix trace-store test")
    background = background_of(request.session)
    store: Phoenix = background.take(STORE, start_phoenix, background.directory(STORE))
    yield store
    store.close()


@dataclass(frozen=True)
class Streamed:
    """What one streamed completion gave its client."""

    span_id: str  # the request span, as the traceresponse header names it
    prompt: str
    text: str
    tokens: int


async def stream_one(session: aiohttp.ClientSession, url: str, index: int) -> Streamed:
    prompt = f"Request {index}: how does a paged KV cache share blocks?"
    body = {"prompt": prompt, "max_tokens": 4 + index % 9, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    async with session.post(url + "/v1/completions", json=body) as reply:
        assert reply.status == 200
        events = sse_events(await reply.read())
        span_id = reply.headers["traceresponse"].split("-")[2]
    chunks = [event for event in events if event != "[DONE]"]
    text = "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])
    return Streamed(span_id, prompt, text, chunks[-1]["usage"]["completion_tokens"])


async def stream_all(url: str) -> list[Streamed]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(stream_one(session, url, i) for i in range(REQUESTS))))


def stored(phoenix: Phoenix, tokens: int, deadline_s: float = 60.0) -> list[dict[str, Any]]:
    """The project's spans once all REQUESTS request spans are in and the step spans account for all `tokens`
    (Phoenix inserts what it receives in batches, a moment later)."""
    end = time.monotonic() + deadline_s
    while True:
        spans = phoenix.spans(PROJECT) if PROJECT in projects(phoenix) else []
        requests = [s for s in spans if s["name"] == "llm.request"]
        stepped = sum(s["attributes"]["pagedserve.step.output_tokens"] for s in spans if s["name"] == "llm.engine_step")
        if (len(requests) == REQUESTS and stepped == tokens) or time.monotonic() > end:
            return spans
        time.sleep(0.5)


def projects(phoenix: Phoenix) -> set[str]:
    return {project["name"] for project in phoenix.get("/v1/projects")["data"]}


def events_named(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [event["attributes"] for event in span["events"] if event["name"] == name]


def test_a_streamed_run_is_stored_in_phoenix(phoenix: Phoenix, files: ModelFiles) -> None:
    settings = TelemetrySettings(otlp_endpoint=phoenix.url, record_content=True)
    server = LiveServer.start(replace(sim_config(ServiceConfig(port=0)), telemetry=settings), cached_builder(files))
    try:
        model = request("GET", server.url + "/v1/models").json()["data"][0]["id"]
        streamed = asyncio.run(stream_all(server.url))
        server.call(lambda: server.state.runtime.telemetry.flush(10.0))  # type: ignore[union-attr]
    finally:
        server.close()
    spans = stored(phoenix, sum(s.tokens for s in streamed))
    requests = {s["context"]["span_id"]: s for s in spans if s["name"] == "llm.request"}
    assert set(requests) == {s.span_id for s in streamed}
    for client in streamed:
        span = requests[client.span_id]
        attributes = span["attributes"]
        assert span["span_kind"] == "LLM" and span["status_code"] != "ERROR"
        assert len(events_named(span, "token")) == client.tokens
        assert attributes["gen_ai.usage.output_tokens"] == attributes["llm.token_count.completion"] == client.tokens
        assert attributes["llm.token_count.prompt"] == attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["llm.token_count.total"] == attributes["llm.token_count.prompt"] + client.tokens
        assert attributes["llm.model_name"] == attributes["gen_ai.request.model"] == model
        assert attributes["gen_ai.operation.name"] == "text_completion"
        assert client.prompt in attributes["input.value"]
        assert events_named(span, "gen_ai.content.prompt") == [{"gen_ai.prompt": attributes["input.value"]}]
        assert attributes["output.value"] == client.text
        (completion,) = events_named(span, "gen_ai.content.completion")
        assert completion["gen_ai.completion"] == client.text
    steps = [s for s in spans if s["name"] == "llm.engine_step"]
    served = [s["attributes"]["pagedserve.step.request_spans"] for s in steps]
    assert all(served) and {span_id for ids in served for span_id in ids} == set(requests)
    assert max(len(ids) for ids in served) > 1  # requests batched together, each step linked to all it served


def test_phoenix_shows_the_run_in_its_ui(phoenix: Phoenix) -> None:
    """What a user opening Phoenix sees, after the test above stored the run: the project's spans, filtered to
    its LLM spans (the requests), each listed with its kind, prompt and completion."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - only with the browser there
    from selenium.webdriver.common.keys import Keys  # noqa: PLC0415

    if PROJECT not in projects(phoenix):
        pytest.fail("the store test above stores the run this one looks at: run the module, not this test alone")
    (project,) = [p for p in phoenix.get("/v1/projects")["data"] if p["name"] == PROJECT]
    with chromium("the Phoenix UI check") as browser:
        browser.get(f"{phoenix.url}/projects/{project['id']}/spans")
        text = lambda: str(browser.execute_script("return document.body.innerText"))  # noqa: E731
        wait_until(lambda: "llm.engine_step" in text() or "llm.request" in text(), 90, "Phoenix's span list")
        box = browser.find_element(By.CSS_SELECTOR, ".cm-content")  # the span filter (a CodeMirror editor)
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("span_kind == 'LLM'", Keys.ENTER)
        wait_until(lambda: "llm.request" in text() and "llm.engine_step" not in text(), 60,
                   "the filtered list: only the requests' LLM spans")
        screenshot(browser, "phoenix.png")
        assert f"Total Traces\n{REQUESTS}\n" in text()  # the filtered project's count: one per request
        assert "Request 4" in text() and "how does" in text()  # recorded prompts, in the list's input column
