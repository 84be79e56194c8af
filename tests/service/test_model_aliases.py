"""--served-model-name with several names: any is accepted in "model", the first is the one reported."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import NotFoundError, OpenAI

from backends.model.loader import ModelFiles
from service.config.command import add_config_flags, flags_of
from service.config.settings import ConfigError, ServiceConfig, load_config
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post, request

NAMES = ("primary", "alias-one", "org/alias-two")


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    live = LiveServer.start(sim_config(ServiceConfig(port=0, served_model_name=NAMES)), cached_builder(model_files))
    yield live
    live.close()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("name", NAMES)
def test_any_name_works_and_the_first_is_reported(client: OpenAI, name: str) -> None:
    out = client.completions.create(model=name, prompt="hi", max_tokens=2)
    assert out.model == "primary"
    chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2, stream=True))
    assert chunks and all(c.model == "primary" for c in chunks)


def test_models_lists_the_first(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["primary"]
    assert client.models.retrieve("alias-one").id == "primary"


def test_other_names_are_404(client: OpenAI, server: LiveServer) -> None:
    with pytest.raises(NotFoundError):
        client.completions.create(model="alias", prompt="hi", max_tokens=1)
    reply = post(server.url + "/v1/completions", {"prompt": "hi", "model": "PRIMARY"})
    assert reply.status == 404 and reply.error()["param"] == "model"
    assert request("GET", server.url + "/v1/models/nope").status == 404


def _flags(*argv: str) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return load_config(None, {}, flags_of(parser.parse_args(argv))).service.served_model_name


def test_names_from_repeated_and_comma_separated_flags() -> None:
    assert _flags("--served-model-name", "a,b", "--served-model-name", "c") == ("a", "b", "c")
    assert _flags("--served-model-name", "only") == ("only",)
    assert _flags() == ()


def test_names_from_env_and_file(tmp_path: Path) -> None:
    assert load_config(None, {"PAGEDSERVE_SERVED_MODEL_NAME": "x, y"}).service.served_model_name == ("x", "y")
    for text, names in (('served_model_name = "one"', ("one",)), ('served_model_name = ["a", "b"]', ("a", "b"))):
        path = tmp_path / "c.toml"
        path.write_text(f"[service]\n{text}\n")
        assert load_config(str(path)).service.served_model_name == names
    path = tmp_path / "bad.toml"
    path.write_text("[service]\nserved_model_name = 5\n")
    with pytest.raises(ConfigError, match="served_model_name"):
        load_config(str(path))
