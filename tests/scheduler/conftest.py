from __future__ import annotations

import pytest

from backends.model.loader import ModelFiles, open_model


@pytest.fixture(scope="module")
def files() -> ModelFiles:
    """The default model's config and tokenizer (header only, no weights)."""
    return open_model()[1]
