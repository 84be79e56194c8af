"""Fixtures for the whole suite."""

from __future__ import annotations

import pytest

from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.native.weights import STORED_TYPES


@pytest.fixture(scope="session")
def real_model() -> LoadedModel:
    """The default model with its weights dequantized to float32, loaded once for the session (a load takes 2-5 s
    and half a dozen modules use it): tests read it and never write into its weights."""
    return load_model()


@pytest.fixture(scope="session")
def real_model_stored() -> LoadedModel:
    """The default model with its weights kept as the file stores them (STORED_TYPES), loaded once."""
    return load_model(stored=STORED_TYPES)
