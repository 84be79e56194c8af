from __future__ import annotations

import pytest

from backends.model.loader import ModelFiles, open_model


@pytest.fixture(scope="session")
def model_files() -> ModelFiles:
    return open_model()[1]
