"""Fixtures for the whole suite."""

from __future__ import annotations

import pytest

from backends.model.loader import LoadedModel, ModelFiles, load_model, open_model
from backends.numpy_backend.native.weights import STORED_TYPES
from tests.background import BACKGROUND, consumers_last, start_selected_modules
from tests.gemma3 import GEMMA_TEMPLATE, gemma3_path


@pytest.fixture(scope="session")
def real_model() -> LoadedModel:
    """The default model with its weights dequantized to float32, loaded once for the session (a load takes 2-5 s
    and half a dozen modules use it): tests read it and never write into its weights."""
    return load_model()


@pytest.fixture(scope="session")
def real_model_stored() -> LoadedModel:
    """The default model with its weights kept as the file stores them (STORED_TYPES), loaded once."""
    return load_model(stored=STORED_TYPES)



@pytest.fixture(scope="session")
def gemma3_stored() -> LoadedModel:
    """Gemma 3 270M with its weights as the file stores them, loaded once (2.5 s, most of it its 262k-token
    tokenizer) for the modules that read it."""
    return load_model(gemma3_path(), stored=STORED_TYPES)


@pytest.fixture(scope="session")
def gemma3_chat_files(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    """Gemma 3's files as a server opens them with `--chat-template` giving Gemma's turns (the file has none)."""
    template = tmp_path_factory.mktemp("gemma3") / "gemma3.jinja"
    template.write_text(GEMMA_TEMPLATE)
    return open_model(gemma3_path(), template)[1]

def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    consumers_last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    start_selected_modules(session)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if BACKGROUND in session.stash:
        session.stash[BACKGROUND].close()
