"""/health, /v1/models and /metrics across the server's phases: loading, ready, failed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.model.loader import ModelFiles
from service.app.server import build_runtime, create_app
from service.config.settings import AppConfig
from service.generation.state import Phase, Runtime
from tests.service.live import LiveServer, sim_config
from tests.service.rawhttp import post, request


@pytest.fixture
def gated(model_files: ModelFiles) -> Iterator[tuple[LiveServer, asyncio.Event]]:
    """A server whose model load waits until the test opens the gate."""
    gate = asyncio.Event()

    async def slow_build(config: AppConfig) -> Runtime:
        await gate.wait()
        return await build_runtime(config, model_files)

    server = LiveServer(create_app(sim_config(), slow_build))
    yield server, gate
    server.close()


def test_health_is_503_while_loading_then_200(gated: tuple[LiveServer, asyncio.Event]) -> None:
    server, gate = gated
    metrics = request("GET", server.url + "/metrics").body.decode()
    assert 'pagedserve:server_phase{phase="loading"} 1.0' in metrics
    assert "pagedserve:num_requests_running 0.0" in metrics  # the engine's gauges are there before the engine
    health = request("GET", server.url + "/health")
    assert health.status == 503 and health.json() == {"status": "loading"}
    assert health.headers["Retry-After"] == "5"
    busy = post(server.url + "/v1/completions", {"prompt": "Hi"})
    assert busy.status == 503 and busy.error()["code"] == "model_loading" and "Retry-After" in busy.headers
    assert request("GET", server.url + "/v1/models").status == 200
    assert request("GET", server.url + "/dashboard").status == 200  # the page, which then retries its feed:
    feed = request("GET", server.url + "/dashboard/events")
    assert feed.status == 503 and feed.error()["code"] == "model_loading" and "Retry-After" in feed.headers
    server.loop.call_soon_threadsafe(gate.set)
    server.run(server.state.settled.wait())
    assert request("GET", server.url + "/health").json() == {"status": "ready"}
    assert post(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status == 200


def test_failed_load_reports_failed() -> None:
    async def broken(config: AppConfig) -> Runtime:
        raise OSError("no such model")

    server = LiveServer(create_app(sim_config(), broken))
    try:
        server.run(server.state.settled.wait())
        assert server.state.phase is Phase.FAILED
        assert request("GET", server.url + "/health").json() == {"status": "failed"}
        reply = post(server.url + "/v1/completions", {"prompt": "Hi"})
        assert reply.status == 503 and "no such model" in reply.error()["message"]
    finally:
        server.close()


def test_metrics_are_one_registry_with_one_name_per_metric(sim_server: LiveServer) -> None:
    assert post(sim_server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status == 200
    families = list(text_string_to_metric_families(request("GET", sim_server.url + "/metrics").body.decode()))
    names = [f.name for f in families]
    assert len(names) == len(set(names)) and all(n.startswith("pagedserve:") for n in names), names
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    assert value["pagedserve:server_phase", (("phase", "ready"),)] == 1.0
    answered = (("method", "POST"), ("route", "/v1/completions"), ("status", "200"))
    assert value["pagedserve:http_requests_total", answered] >= 1
    used, free = (value["pagedserve:kv_cache_blocks", (("state", s),)] for s in ("used", "free"))
    assert used + free == 512 and value["pagedserve:kv_cache_usage_ratio", ()] == used / 512  # the live pool
    # the engine's live gauges and telemetry's metrics, side by side in the one exposition
    assert {"pagedserve:num_requests_running", "pagedserve:num_requests_waiting",
            "pagedserve:time_to_first_token_seconds", "pagedserve:generation_tokens"} <= set(names)


def test_models_card(sim_server: LiveServer) -> None:
    [card] = request("GET", sim_server.url + "/v1/models").json()["data"]
    assert card["id"] == "SmolLM2-135M-Instruct" and card["object"] == "model" and card["max_model_len"] == 8192
