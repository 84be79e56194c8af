from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.model.loader import ModelFiles, open_model
from tests.service.live import LiveServer


@pytest.fixture(scope="session")
def model_files() -> ModelFiles:
    return open_model()[1]


@pytest.fixture
def servers() -> Iterator[list[LiveServer]]:
    """Fault servers a test started: each released from any hang it holds, then closed."""
    started: list[LiveServer] = []
    yield started
    for server in started:
        server.engine.backend.faults.release()  # type: ignore[attr-defined]
        server.close()
