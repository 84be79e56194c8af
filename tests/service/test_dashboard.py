"""The live dashboard over real HTTP on loopback: the page and its assets are served open, the feed behind the API
key; a viewer gets the snapshot, then each request's rows and its end; the counts at rest are /metrics' own; a
viewer that stops reading loses records (counted) and stalls nothing; too many viewers get 429; shutdown ends the
feed; with the dashboard off, all of it is 404."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import OpenAI

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from service.dashboard.feed import MAX_VIEWERS
from service.dashboard.routes import FEED_KEY
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import request
from tests.waiting import wait_until

KEY = "dash-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Feed:
    """A viewer of /dashboard/events: SSE events read one by one, as (name, data)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout: float = 15.0) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        self.conn.request("GET", "/dashboard/events", headers=headers or {})
        self.response = self.conn.getresponse()

    def next(self) -> tuple[str, Any]:
        name, data = "", ""
        while True:
            line = self.response.readline().decode()
            assert line, "the feed ended"
            if line.startswith("event: "):
                name = line[7:].strip()
            elif line.startswith("data: "):
                data = line[6:].strip()
            elif line == "\n" and name:
                return name, json.loads(data)

    def until(self, predicate: Any, limit: int = 5000) -> list[tuple[str, Any]]:
        """Events up to and including the first that satisfies predicate(name, data)."""
        seen = []
        for _ in range(limit):
            seen.append(self.next())
            if predicate(*seen[-1]):
                return seen
        pytest.fail("the awaited event never came")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    live = LiveServer.start(sim_config(ServiceConfig(port=0, api_keys=(KEY,)), max_num_seqs=32),
                            cached_builder(model_files))
    yield live
    live.close()


def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def viewers(server: LiveServer) -> float:
    return server.metrics()["pagedserve:dashboard_viewers"]


def dropped(server: LiveServer) -> float:
    return server.metrics()["pagedserve:dashboard_records_dropped_total"]


def test_the_page_is_open_and_the_feed_needs_the_key(server: LiveServer) -> None:
    page = request("GET", server.url + "/dashboard")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b"/dashboard/dashboard.js" in page.body and b"/dashboard/dashboard.css" in page.body
    for asset, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        reply = request("GET", f"{server.url}/dashboard/{asset}")
        assert reply.status == 200 and reply.headers["Content-Type"].startswith(kind) and reply.body
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = request("GET", server.url + "/dashboard/events", headers=headers)
        assert refused.status == 401 and refused.error()["code"] == "invalid_api_key"
    feed = Feed(server.url, AUTH)
    try:
        assert feed.response.status == 200
        assert feed.response.getheader("Content-Type") == "text/event-stream"
        name, hello = feed.next()
        assert name == "hello" and hello["model"] == server.state.model_name and hello["backend"] == "sim"
        assert hello["kv"]["total"] == len(hello["detail"]["map"]) == 512 and hello["block_size"] == 16
    finally:
        feed.close()


def test_a_request_shows_in_rows_then_ends_with_its_counts(server: LiveServer) -> None:
    feed = Feed(server.url, AUTH)
    try:
        feed.next()  # hello
        reply = client(server).completions.with_raw_response.create(
            model=server.state.model_name, prompt="Tell me about paged attention " * 20, max_tokens=12,
            extra_headers={"X-Request-Id": "dash-req-1"})
        completion = reply.parse()
        assert completion.usage is not None
        events = feed.until(lambda name, data: any("dash-req-1" in f["id"] for f in data.get("finished", ())))
    finally:
        feed.close()
    rows = [row for name, data in events if name == "step" for row in _rows(data["rows"]) if row["id"] == completion.id]
    assert rows[0]["phase"] == "p" and rows[-1]["phase"] == "d"
    assert sum(row["tokens"] for row in rows) == completion.usage.prompt_tokens + 11  # the last token: no KV
    assert rows[-1]["context"] == completion.usage.prompt_tokens + 11
    (ended,) = [f for f in events[-1][1]["finished"] if "dash-req-1" in f["id"]]
    assert ended["id"] == completion.id  # the response's id: the X-Request-Id, prefixed as the API prefixes it
    assert (ended["reason"], ended["prompt_tokens"], ended["completion_tokens"]) == (
        "length", completion.usage.prompt_tokens, 12)
    assert ended["ttft_ms"] > 0 and ended["error"] is None


def _rows(columns: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def test_at_rest_the_snapshot_counts_what_metrics_report(server: LiveServer) -> None:
    shared = "A shared system prompt for the dashboard's count. " * 8
    for suffix in ("one", "two"):
        client(server).completions.create(model=server.state.model_name, prompt=shared + suffix, max_tokens=4)
    feed = Feed(server.url, AUTH)
    try:
        _, hello = feed.next()
    finally:
        feed.close()
    kv, states = hello["kv"], hello["detail"]["map"]
    assert kv["cached"] > 0  # the shared prompt's blocks stay in the prefix cache
    shown = {"used": kv["used"], "free": kv["free"], "cached": kv["cached"], "shared": hello["detail"]["shared"]}
    assert shown == server.kv_blocks()
    assert states.count("c") == kv["cached"] and kv["free"] == states.count(".") + kv["cached"]


def test_a_viewer_that_stops_reading_loses_records_and_stalls_nothing(server: LiveServer) -> None:
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    stalled.connect((host, port))
    stalled.sendall(f"GET /dashboard/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    api = client(server)

    def one(i: int) -> int:
        done = api.completions.create(model=server.state.model_name, prompt=f"Count {i}", max_tokens=100)
        return done.usage.completion_tokens if done.usage is not None else 0

    try:
        wait_until(lambda: viewers(server) == 1, what="the stalled viewer connected")
        before, rounds = dropped(server), 0
        with ThreadPoolExecutor(32) as pool:  # rounds of 32 streams until the socket's buffers and then the
            while dropped(server) == before:  # viewer's queue are full, and its oldest records go
                assert list(pool.map(one, range(32))) == [100] * 32  # every request served meanwhile
                rounds += 1
                assert rounds < 100, "the stalled viewer never lost a record"
        stalled.settimeout(10)
        assert b"event: dropped" in _read_some(stalled, 100_000_000)  # told, once it reads again
    finally:
        stalled.close()
    wait_until(lambda: viewers(server) == 0, what="the viewer's departure")
    assert not server.call(lambda: server.app[FEED_KEY].watching)


def _read_some(sock: socket.socket, limit: int) -> bytes:
    got = b""
    while len(got) < limit and b"event: dropped" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_viewers_past_the_limit_get_429(server: LiveServer) -> None:
    feeds = [Feed(server.url, AUTH) for _ in range(MAX_VIEWERS)]
    try:
        assert all(f.response.status == 200 for f in feeds)
        refused = request("GET", server.url + "/dashboard/events", headers=AUTH)
        assert refused.status == 429 and refused.error()["code"] == "too_many_viewers"
    finally:
        for f in feeds:
            f.close()
    wait_until(lambda: viewers(server) == 0, what="the viewers' departure")
    assert request("GET", server.url + "/health").status == 200


def test_shutdown_ends_the_feed(model_files: ModelFiles) -> None:
    live = LiveServer.start(sim_config(), cached_builder(model_files))
    feed = Feed(live.url)
    try:
        assert feed.next()[0] == "hello"
        live.close()
        assert feed.response.readline() == b""  # the stream ended: the page reconnects to what serves next
    finally:
        feed.close()


def test_with_the_dashboard_off_everything_is_404(model_files: ModelFiles) -> None:
    live = LiveServer.start(sim_config(ServiceConfig(port=0, dashboard=False)), cached_builder(model_files))
    try:
        for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/events"):
            reply = request("GET", live.url + path)
            assert reply.status == 404 and reply.error()["type"] == "not_found_error"
        assert "dashboard_viewers" not in request("GET", live.url + "/metrics").body.decode()
    finally:
        live.close()
