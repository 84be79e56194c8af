"""SSE pacing: under a small event budget, tokens merge into fewer events and the text is unchanged."""

from __future__ import annotations

import asyncio

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from service.generation.pacing import ActiveStreams, Pacer
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, sse_events


def test_pacer_spaces_events_by_each_streams_share() -> None:
    async def gaps(budget: float) -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        streams = ActiveStreams()
        with streams, streams:  # two open streams share the budget
            pacer = Pacer(streams, budget)
            t0 = loop.time()
            await pacer.pace()
            t1 = loop.time()
            await pacer.pace()
            return t1 - t0, loop.time() - t1

    first, second = asyncio.run(gaps(100.0))  # 2 streams / 100 events/s: 20 ms apart
    assert first < 0.005 and 0.015 <= second < 0.5
    assert max(asyncio.run(gaps(0.0))) < 0.005  # budget 0: no pacing


def test_paced_stream_merges_tokens_and_keeps_the_text(model_files: ModelFiles) -> None:
    server = LiveServer.start(sim_config(ServiceConfig(port=0, max_stream_events_per_s=20)),
                              cached_builder(model_files))
    try:
        body = {"prompt": "Pace me", "max_tokens": 64, "temperature": 0}
        whole = post(server.url + "/v1/completions", body).json()["choices"][0]["text"]
        events = sse_events(post(server.url + "/v1/completions", {**body, "stream": True}).body)
        chunks = [e for e in events if isinstance(e, dict)]
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole
        assert len(chunks) < 32  # 64 tokens in far fewer events
    finally:
        server.close()
