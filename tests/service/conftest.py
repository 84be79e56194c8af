from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.model.loader import ModelFiles, open_model
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config


@pytest.fixture(scope="session")
def model_files() -> ModelFiles:
    return open_model()[1]


@pytest.fixture(scope="session")
def sim_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    """The real engine on the zero-cost sim backend, shared by the tests that do not reconfigure it."""
    server = LiveServer.start(sim_config(ServiceConfig(port=0, max_body_bytes=64 * 1024)), cached_builder(model_files))
    yield server
    server.close()
