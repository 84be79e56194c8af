"""The dashboard in a real browser: the distribution's headless Chromium, driven by Selenium through the
distribution's chromedriver, loads GET /dashboard from a live server running the real model under load.

It checks what a user would: the timeline grows, a request's lane appears and finishes, hovering a lane lights its
blocks, the block map's counts at rest are /metrics' KV gauges, the page reconnects after the server restarts,
and the browser's console stays clean. Required under CI=true (`make browser-tools` installs Chromium); skipped
elsewhere when Chromium is missing (tests/browser.py). With PAGEDSERVE_SCREENSHOTS=dir it saves the busy page there
(how docs/results/dashboard.png is made)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import OpenAI

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from kvpool import KVPoolConfig
from scheduler.config import SchedulerConfig
from service.config.settings import AppConfig, ServiceConfig
from tests.browser import chromium, console_problems, screenshot
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.waiting import wait_until

KEY = "browser-key"


def server_config() -> AppConfig:
    return AppConfig(ServiceConfig(port=0, api_keys=(KEY,)), BackendConfig(name="numpy"),
                     SchedulerConfig(max_model_len=512, max_num_seqs=8), KVPoolConfig(num_blocks=256))


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium("the dashboard's browser test") as driver:
        yield driver


SYSTEM = "You are a storyteller who writes short tales about paged memory and patient schedulers. "  # shared


class Load:
    """Streams of completions in threads, each starting its next as its last ends, until stopped; their prompts
    share a first block or two (the prefix cache shares them) and there are more streams than rows (a queue)."""

    def __init__(self, url: str, model: str, streams: int, max_tokens: int = 24) -> None:
        self.api = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        self.model, self.stop, self.max_tokens = model, threading.Event(), max_tokens
        self.errors: list[Exception] = []
        self.done = 0  # requests completed (a += from several threads: a count, not a check)
        self.threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(streams)]
        for thread in self.threads:
            thread.start()

    def _worker(self, index: int) -> None:
        while not self.stop.is_set():
            try:
                self.api.completions.create(model=self.model, prompt=f"{SYSTEM}Story {index}: once upon a time",
                                            max_tokens=self.max_tokens + 8 * index, temperature=0.8)
                self.done += 1
            except Exception as exc:  # noqa: BLE001 - kept, then asserted empty
                self.errors.append(exc)
                return

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def page_state(driver: Any) -> dict[str, Any]:
    return driver.execute_script("const d = window.pagedserveDashboard; return d && {connected: d.connected, "
                                 "records: d.records, lastStep: d.lastStep, kv: d.kv, lanes: d.lanes(), "
                                 "errors: d.errors};") or {}


def text_of(driver: Any, element_id: str) -> str:
    return str(driver.execute_script(f"return document.getElementById('{element_id}').textContent.trim();"))


def wait_page(driver: Any, predicate: Callable[[dict[str, Any]], Any], what: str, timeout: float = 60) -> None:
    wait_until(lambda: bool(predicate(page_state(driver))), timeout, what)


def lane_state(driver: Any, lane_id: str) -> str | None:
    return next((lane["state"] for lane in page_state(driver).get("lanes", []) if lane["id"] == lane_id), None)


def page_counts(driver: Any) -> dict[str, int]:
    return {name: int(text_of(driver, f"kv-{name}")) for name in ("used", "free", "cached", "shared")}


@pytest.mark.slow
def test_the_dashboard_shows_a_live_server_in_chromium(browser: Any, model_files: ModelFiles) -> None:
    from selenium.webdriver.common.action_chains import ActionChains  # noqa: PLC0415 - after the browser's skip
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    server = LiveServer.start(server_config(), cached_builder(model_files), timeout=180)
    load = Load(server.url, server.state.model_name, streams=10)
    try:
        browser.get(f"{server.url}/dashboard#key={KEY}")
        wait_page(browser, lambda s: s.get("connected") and s["records"] > 0, "the page's first step record")
        first = page_state(browser)["records"]
        wait_page(browser, lambda s: s["records"] >= first + 20, "the timeline growing by 20 steps")
        assert text_of(browser, "status") == "live" and int(text_of(browser, "kv-total")) == 256
        lane = "cmpl-browser-lane-1"
        client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        reply = client.completions.create(model=server.state.model_name, prompt="A lane of its own", max_tokens=24,
                                          extra_headers={"X-Request-Id": "browser-lane-1"})
        assert reply.id == lane
        wait_until(lambda: lane_state(browser, lane) == "finished", 30, "the request's lane finished")
        busy = next(e for e in browser.find_elements(By.CSS_SELECTOR, ".lane[data-state='decode']"))
        ActionChains(browser).move_to_element(busy).perform()
        wait_until(lambda: browser.execute_script("return window.pagedserveDashboard.highlighted().length") > 0, 10,
                   "the hovered lane's blocks lit in the block map")
        screenshot(browser, "dashboard.png")
        assert console_problems(browser) == [], "the browser's console reported problems"
    finally:
        load.close()
    assert not load.errors
    wait_until(lambda: server.stats().num_requests == 0, 60, "the load's end")
    wait_until(lambda: page_counts(browser) == server.kv_blocks(), 15,
               "the block map's counts at rest equal to /metrics' KV gauges")
    assert page_counts(browser)["cached"] > 0  # the prompts' blocks stay cached: not an empty comparison
    port = urlsplit(server.url).port or 0
    server.close()
    wait_until(lambda: text_of(browser, "status") == "reconnecting", 15, "the page noticing the restart")
    restarted = LiveServer.start(server_config(), cached_builder(model_files), timeout=180, port=port)
    try:
        wait_until(lambda: text_of(browser, "status") == "live", 30, "the page reconnected")
        OpenAI(base_url=restarted.url + "/v1", api_key=KEY, max_retries=0).completions.create(
            model=restarted.state.model_name, prompt="After the restart", max_tokens=4)
        wait_page(browser, lambda s: s["lastStep"] > 0 and s["records"] > 0, "records from the new server")
    finally:
        restarted.close()
    # while the server was down, the page's retries failed to connect, which Chromium logs: nothing else
    assert [e for e in console_problems(browser) if "/dashboard/events" not in e["message"]] == []
    assert page_state(browser)["errors"] == []


def page_sizes(driver: Any) -> dict[str, int]:
    return dict(driver.execute_script(
        "const d = window.pagedserveDashboard; return {records: d.records, lanes: d.lanes().length, "
        "open: d.lanes().filter(l => !['finished', 'aborted'].includes(l.state)).length, "
        "rows: document.querySelectorAll('#lanes > .lane').length, steps: d.stepsKept(), "
        "heap: Math.round(performance.memory.usedJSHeapSize / 2 ** 20)};"))


@pytest.mark.slow
def test_the_page_stays_bounded_under_a_fast_feed(browser: Any, model_files: ModelFiles) -> None:
    """A busy server's feed, fast: zero-cost steps, hundreds of records and dozens of short requests a second.
    Whatever ran before, the page holds every request in flight plus the last 100 ended (in memory and in its
    DOM) and at most 600 steps, so a tab left open for hours holds no more; its heap stays small, and at rest its
    lanes are all closed and its counts are the server's."""
    server = LiveServer.start(sim_config(ServiceConfig(port=0, api_keys=(KEY,)), max_num_seqs=32),
                              cached_builder(model_files))
    try:
        browser.get(f"{server.url}/dashboard#key={KEY}")
        wait_until(lambda: text_of(browser, "status") == "live", 30, "the page connected")
        load = Load(server.url, server.state.model_name, streams=24, max_tokens=4)
        try:
            wait_until(lambda: page_sizes(browser)["records"] > 1500, 120, "1500 step records on the page")
            busy = page_sizes(browser)
        finally:
            load.close()
        assert not load.errors
        wait_until(lambda: page_sizes(browser)["open"] == 0, 30, "every lane closed once the load ended")
        rest = page_sizes(browser)
        wait_until(lambda: page_counts(browser) == server.kv_blocks(), 15, "the counts at rest")
    finally:
        server.close()
    assert busy["lanes"] <= busy["open"] + 100 and busy["rows"] == busy["lanes"] and busy["steps"] == 600
    assert rest["lanes"] == rest["rows"] == 100 and load.done > 150  # the last 100 ended, of many more
    assert rest["heap"] < 64, f"{rest['heap']} MiB of JavaScript heap"
    assert [e for e in console_problems(browser)] == [] and page_state(browser)["errors"] == []
