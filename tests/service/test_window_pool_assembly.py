"""Gemma 3 (five sliding layers in six) assembled as the server does it: the sliding layers get a KV pool of
their own, the backend's arrays are sized to each pool, the start-up log and /metrics report both, and a window
pool too small for one sequence is refused at start-up in one line."""

from __future__ import annotations

import logging

import pytest

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.numpy_backend.backend import NumpyBackend
from kvpool import HybridKVCacheManager, KVPoolConfig, PagedKVCacheManager
from kvpool.sizing import window_table_blocks
from scheduler.config import SchedulerConfig
from service.app.assemble import build_parts
from service.config.settings import AppConfig, ServiceConfig, load_config
from tests.gemma3 import gemma3_path
from tests.service.live import LiveServer, cached_builder
from tests.service.test_cli import assert_one_line_error, run

BUDGET = 256 * 2**20


def test_the_sliding_layers_get_a_pool_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    env = {"PAGEDSERVE_MODEL": str(gemma3_path()), "PAGEDSERVE_KV_CACHE_MEMORY": "256MiB",
           "PAGEDSERVE_MAX_NUM_SEQS": "8"}
    with caplog.at_level(logging.INFO, logger="service.app.assemble"):
        parts = build_parts(load_config(env=env))
    kv, backend = parts.kv, parts.backend
    assert isinstance(kv, HybridKVCacheManager) and isinstance(backend, NumpyBackend)
    geo = backend.kv_geometry
    assert (geo.num_layers, geo.window_layers, geo.sliding_window) == (18, 15, 512)
    sliding = [i for i in range(18) if backend.model.config.layer_window(i)]
    assert [backend.cache.keys[i].shape[0] for i in range(18)] == [
        kv.window_blocks if i in sliding else kv.num_blocks for i in range(18)]
    assert kv.window_blocks == 8 * (window_table_blocks(512, 16, 1) + 1) + 512 // 16
    held = sum(k.nbytes + v.nbytes for k, v in zip(backend.cache.keys, backend.cache.values, strict=True))
    one_pool = BUDGET // (18 * 2 * 256 * 4 * 16)  # blocks of every layer the budget holds
    assert BUDGET - 3 * 2 * 256 * 4 * 16 < held <= BUDGET and kv.num_blocks > 2 * one_pool
    assert (f"KV cache: {kv.num_blocks} blocks of 16 tokens for the 3 full-attention layers "
            f"({kv.num_blocks * 16} tokens), {kv.window_blocks} blocks for the 15 sliding layers' 512-position "
            f"windows; {held / 2**20:.1f} MiB") in caplog.text


def test_the_contiguous_layout_keeps_one_pool() -> None:
    env = {"PAGEDSERVE_MODEL": str(gemma3_path()), "PAGEDSERVE_NUM_BLOCKS": "96", "PAGEDSERVE_KV_LAYOUT": "contiguous",
           "PAGEDSERVE_MAX_MODEL_LEN": "1024"}
    parts = build_parts(load_config(env=env))
    assert not isinstance(parts.kv, HybridKVCacheManager) and parts.kv.window_blocks == 0
    assert isinstance(parts.backend, NumpyBackend)
    assert {k.shape[0] for k in parts.backend.cache.keys} == {96}
    assert not isinstance(parts.kv, PagedKVCacheManager)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_window_pool_too_small_for_one_sequence_is_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                                        command: str) -> None:
    extra = ["--prompt", "x"] if command == "generate" else ["--port", "0"]
    code, _, err = run(capsys, command, "--model", str(gemma3_path()), "--num-window-blocks", "40", *extra)
    assert code == 2
    said = "\n".join(line for line in err.splitlines() if not line.startswith("pagedserve listening"))  # serve's
    assert_one_line_error(said, "kv: the sliding layers' pool needs at least 65 blocks", "got 40")


def test_metrics_count_the_window_pool_apart(gemma3_chat_files: ModelFiles) -> None:
    """A completion over HTTP with the official client; /metrics then gives the window pool's blocks beside the
    full layers' (all free again once the request is done)."""
    from openai import OpenAI  # noqa: PLC0415 - the client, only for this test

    config = AppConfig(ServiceConfig(port=0), BackendConfig(name="numpy"), SchedulerConfig(max_model_len=1024),
                       KVPoolConfig(num_blocks=96))
    server = LiveServer.start(config, cached_builder(gemma3_chat_files), timeout=120)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        name = client.models.list().data[0].id
        out = client.completions.create(model=name, prompt="The capital of France is", max_tokens=4, temperature=0)
        assert out.usage is not None and out.usage.completion_tokens == 4
        series = server.metrics()
        window = {s: series[f'pagedserve:kv_cache_window_blocks{{state="{s}"}}'] for s in ("used", "free")}
        assert window == {"used": 0.0, "free": 96.0}  # num_blocks: less than 64 sequences' windows want
        assert series['pagedserve:kv_cache_blocks{state="free"}'] == 96.0
    finally:
        server.close()
