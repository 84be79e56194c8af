"""Prompts and outputs reach the log only when `log_prompts` is on."""

from __future__ import annotations

import logging

import pytest

from backends.model.loader import ModelFiles
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post

SECRET = "my secret prompt"


def transcript(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "service.transcript"]


def test_prompts_are_not_logged_by_default(sim_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        assert post(sim_server.url + "/v1/completions", {"prompt": SECRET, "max_tokens": 2}).status == 200
    assert not any(SECRET in r.getMessage() for r in caplog.records)


def test_log_prompts_logs_prompt_and_output(model_files: ModelFiles, caplog: pytest.LogCaptureFixture) -> None:
    server = LiveServer.start(sim_config(ServiceConfig(port=0, log_prompts=True)), cached_builder(model_files))
    with caplog.at_level(logging.INFO, logger="service.transcript"):
        try:
            whole = post(server.url + "/v1/completions", {"prompt": SECRET, "max_tokens": 3}).json()
            post(server.url + "/v1/completions", {"prompt": SECRET, "max_tokens": 3, "stream": True})
        finally:
            server.close()  # waits for the streaming handler, which logs as it ends
    lines = transcript(caplog)
    assert len(lines) == 2 and all(SECRET in line for line in lines)
    assert repr(whole["choices"][0]["text"]) in lines[0]
