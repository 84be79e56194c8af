"""The load generator against a scripted server: timings, bounds, load shapes, errors, sessions."""

from __future__ import annotations

import asyncio
import statistics
from itertools import islice

import pytest

from bench.loadgen.arrivals import arrival_times
from bench.loadgen.measure import Measurement, measure
from bench.loadgen.spec import Bounds, LoadShape, Target
from bench.loadgen.sse import EventSplitter
from bench.loadgen.workloads import ChatWorkload, Lengths, RandomWorkload, Workload
from tests.bench.fake_server import Script, serving

WORKLOAD = RandomWorkload(Lengths(8), Lengths(6))


def bench(script: Script, shape: LoadShape, bounds: Bounds, workload: Workload = WORKLOAD,
          endpoint: str = "completions") -> Measurement:
    async def go() -> Measurement:
        async with serving(script) as url:
            return await measure(Target(url, endpoint), workload, shape, bounds)
    return asyncio.run(go())


def test_measured_latencies_match_the_servers_timing() -> None:
    script = Script(first_s=0.08, gap_s=0.03)
    m = bench(script, LoadShape(concurrency=4), Bounds(12))
    s = m.summary
    assert s.completed == 12 and s.failed == 0 and s.output_tokens == 72 and s.input_tokens == 84
    assert s.token_source == {"usage": 12}
    assert s.ttft_ms.p50 == pytest.approx(80, abs=20)
    assert s.itl_ms.p50 == pytest.approx(30, abs=10) and s.itl_ms.count == 12 * 5
    assert s.tpot_ms.p50 == pytest.approx(30, abs=10)
    assert s.e2e_ms.p50 == pytest.approx(80 + 5 * 30, abs=40)


def test_a_server_closing_each_streams_connection_unannounced_loses_no_request() -> None:
    """llama-server (cpp-httplib) closes the connection after a streamed response without `Connection: close`;
    a request written on that pooled connection before the close is seen goes again on a new one, and only
    that one reaches the server: every request completes once."""
    script = Script(gap_s=0.001, close_after_stream=True)
    m = bench(script, LoadShape(concurrency=2), Bounds(40))
    assert (m.summary.completed, m.summary.failed, len(script.bodies)) == (40, 0, 40), m.summary.errors


def test_count_bound_and_warmup() -> None:
    script = Script()
    m = bench(script, LoadShape(concurrency=3), Bounds(10, warmup=4))
    assert len(m.record.results) == 10 and len(script.bodies) == 14
    assert script.max_in_flight <= 3


def test_time_bound_stops_sending() -> None:
    script = Script(first_s=0.05)
    m = bench(script, LoadShape(concurrency=2), Bounds(None, duration_s=0.5))
    assert 6 <= len(m.record.results) <= 22  # about 0.5 s / 0.05 s per request per client, 2 clients
    assert m.record.duration_s < 1.5


def test_open_loop_sends_on_the_poisson_schedule() -> None:
    script = Script()
    rate, n = 40.0, 40
    bench(script, LoadShape(rate=rate, seed=9), Bounds(n))
    sent = [t - script.arrivals[0] for t in script.arrivals]
    planned = list(islice(arrival_times(rate, 1.0, 9), n))
    assert len(sent) == n
    lateness = [s - p for s, p in zip(sent, planned, strict=True)]
    assert statistics.median(abs(x) for x in lateness) < 0.02
    assert max(abs(x) for x in lateness) < 0.25


def test_concurrency_caps_an_open_loop() -> None:
    script = Script(first_s=0.05)
    m = bench(script, LoadShape(concurrency=3, rate=float("inf")), Bounds(9))
    assert m.summary.completed == 9 and script.max_in_flight == 3


def test_errors_are_grouped_by_status() -> None:
    m = bench(Script(status=503), LoadShape(concurrency=2), Bounds(4))
    assert m.summary.errors == {"HTTP 503": 4} and m.summary.completed == 0
    m = bench(Script(error_event=True), LoadShape(concurrency=2), Bounds(3))
    assert m.summary.errors == {"stream error: engine_error": 3}
    refused = asyncio.run(measure(Target("http://127.0.0.1:9"), WORKLOAD, LoadShape(concurrency=1), Bounds(2)))
    assert refused.summary.failed == 2 and refused.summary.completed == 0


def test_missing_usage_falls_back_to_chunks() -> None:
    m = bench(Script(usage=False), LoadShape(concurrency=1), Bounds(2))
    assert m.summary.token_source == {"chunks": 2} and m.summary.output_tokens == 12


def test_chat_sessions_resend_the_history_with_real_answers() -> None:
    script = Script()
    workload = ChatWorkload(turns=3, user_len=Lengths(4), output_len=Lengths(2), system_len=5)
    m = bench(script, LoadShape(concurrency=1), Bounds(3), workload, endpoint="chat")
    assert m.summary.completed == 3
    roles = [[msg["role"] for msg in body["messages"]] for body in script.bodies]
    assert roles == [["system", "user"], ["system", "user", "assistant", "user"],
                     ["system", "user", "assistant", "user", "assistant", "user"]]
    assert script.bodies[1]["messages"][2]["content"] == " w0 w1"  # what the server streamed the first time
    assert all(body["stream_options"] == {"include_usage": True} and body["ignore_eos"] for body in script.bodies)


def test_session_header_carries_one_id_per_chat_session() -> None:
    script = Script()
    workload = ChatWorkload(turns=3, user_len=Lengths(4), output_len=Lengths(2))

    async def go() -> Measurement:
        async with serving(script) as url:
            target = Target(url, "chat", session_header="X-Session-Id")
            return await measure(target, workload, LoadShape(concurrency=2), Bounds(6))

    assert asyncio.run(go()).summary.completed == 6
    ids = [h["X-Session-Id"] for h in script.headers]
    turns = [sum(m["role"] == "user" for m in body["messages"]) for body in script.bodies]
    assert len(set(ids)) == 2 and all(ids.count(i) == 3 for i in set(ids))
    for session in set(ids):
        assert sorted(t for i, t in zip(ids, turns, strict=True) if i == session) == [1, 2, 3]


def test_no_session_header_unless_asked() -> None:
    script = Script()
    bench(script, LoadShape(concurrency=1), Bounds(2))
    assert not any("X-Session-Id" in h for h in script.headers)


def test_sse_events_split_across_reads() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b'data: {"a"') == []
    assert splitter.feed(b': 1}\r\n\r\n: keep-alive\n\ndata: [DO') == [b'{"a": 1}']
    assert splitter.feed(b"NE]\n\n") == [b"[DONE]"]
