"""Real OTLP/HTTP export to a receiver started by the test (aiohttp, protobuf decoded), and a collector that
is down: requests still complete, dropped spans are counted, one warning is logged."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from backends.model.loader import ModelFiles
from telemetry import Telemetry, TelemetryConfig, extract_context
from tests.telemetry.receiver import OtlpReceiver, attrs, closed_port
from tests.telemetry.rig import make_rig
from tests.telemetry.test_metrics import samples, value
from tests.waiting import wait_until

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def otlp(endpoint: str, **config: object) -> Callable[[Callable[[], float]], Telemetry]:
    cfg = TelemetryConfig(exporter="otlp-http", endpoint=endpoint, service_name="pagedserve-test",
                          headers={"x-tenant": "t1"}, schedule_delay_s=0.05, export_timeout_s=0.5,
                          shutdown_timeout_s=2.0, **config)  # type: ignore[arg-type]
    return lambda clock: Telemetry(cfg, clock=clock)


def by_request(spans: list[Span]) -> dict[str, Span]:
    return {attrs(s.attributes)["pagedserve.request.id"]: s for s in spans if s.name == "llm.request"}


def test_spans_arrive_over_otlp_http(files: ModelFiles) -> None:
    with OtlpReceiver() as receiver:
        rig, telemetry = make_rig(files, otlp(receiver.endpoint), max_num_batched_tokens=96)
        rig.submit("decoder", 16, 24, trace_context=extract_context({"traceparent": TRACEPARENT}))
        for _ in range(6):
            rig.step()
        rig.submit("prompt", 300, 3, seed=1)  # long prompt in 96-token chunks, each shared with the decoder
        outs = rig.run()
        assert telemetry.flush()
        telemetry.shutdown()
        spans = receiver.spans
        assert receiver.resource_attributes()["service.name"] == "pagedserve-test"
        assert receiver.headers[0]["x-tenant"] == "t1"
    requests = by_request(spans)
    decoder = requests["decoder"]
    assert decoder.trace_id.hex() == TRACE_ID and decoder.kind == Span.SPAN_KIND_SERVER
    a = attrs(decoder.attributes)
    assert a["gen_ai.usage.output_tokens"] == 24 and a["gen_ai.response.finish_reasons"] == ("length",)
    tokens = [e for e in decoder.events if e.name == "token"]
    assert len(tokens) == len(outs["decoder"].choices[0].token_ids) == 24
    times = [e.time_unix_nano for e in tokens]
    assert times == sorted(times) and len(set(times)) == 24
    assert decoder.start_time_unix_nano <= times[0] and times[-1] <= decoder.end_time_unix_nano
    assert abs(decoder.start_time_unix_nano / 1e9 - time.time()) < 600  # epoch time, not the engine's clock
    slow = [attrs(e.attributes) for e in decoder.events if e.name == "slow_token"]
    assert slow and slow[0]["pagedserve.slow_token.cause"] == "prefill_interference"
    assert slow[0]["pagedserve.step.prefill_tokens"] == 95  # the budget less the decode token
    steps = [s for s in spans if s.name == "llm.engine_step"]
    assert len(steps) == len(rig.tee.steps)
    linked = {link.span_id for s in steps for link in s.links}
    assert {r.span_id for r in requests.values()} <= linked
    prompt = requests["prompt"]
    chunks = [s for s in spans if s.name == "llm.request.prefill" and s.parent_span_id == prompt.span_id]
    assert len(chunks) == 4  # 300 tokens next to a decode: 95, 95, 95, 15


def dropped_past(telemetry: Telemetry, count: int) -> Callable[[], bool]:
    return lambda: telemetry.spans_dropped > count


def test_collector_down_drops_counts_and_warns_once(files: ModelFiles, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    rig, telemetry = make_rig(files, otlp(f"http://127.0.0.1:{closed_port()}"), profile="zero", clock="real")
    for wave in range(3):
        before = telemetry.spans_dropped
        for i in range(4):
            rig.submit(f"w{wave}-{i}", 20, 8, seed=i)
        outs = rig.run()
        assert all(len(o.choices[0].token_ids) == 8 for o in outs.values())
        # each wave's spans fail to export before the next wave: an outage seen again and again, warned of once
        wait_until(dropped_past(telemetry, before), what=f"wave {wave}'s spans dropped")
    telemetry.flush()
    dropped = telemetry.spans_dropped
    m = samples(telemetry)
    telemetry.shutdown()
    assert dropped > 0 and value(m, "telemetry_spans_dropped_total") == dropped
    assert telemetry.spans_dropped >= dropped
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "dropping trace spans" in warnings[0].getMessage() and warnings[0].name == "pagedserve.telemetry"
    assert value(m, "generation_tokens_total") == 3 * 4 * 8  # metrics unaffected


class BlockedExporter(SpanExporter):
    """Holds the export thread until released: the span queue fills up behind it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(10)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_full_queue_sheds_and_counts_every_span(files: ModelFiles) -> None:
    exporter = BlockedExporter()
    config = TelemetryConfig(max_queue_size=12, max_export_batch_size=4, schedule_delay_s=0.01)
    rig, telemetry = make_rig(files, lambda clock: Telemetry(config, clock=clock, span_exporter=exporter))
    for i in range(6):
        rig.submit(f"r{i}", 10, 4, seed=i)
    rig.run()  # done while the exporter is held: the engine never waits on export
    expected = 6 * 4 + len(rig.tee.steps)  # request, queue, prefill, decode spans; one span per step
    assert telemetry.flush(timeout=0.5) is False  # the export thread is held: force_flush cannot finish
    exporter.release.set()
    assert telemetry.flush()
    telemetry.shutdown()
    assert telemetry.spans_dropped > 0
    assert len(exporter.spans) + telemetry.spans_dropped == expected
