"""API keys: Bearer auth on /v1, several keys and a key file; /health and /metrics stay open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AuthenticationError, OpenAI

from backends.model.loader import ModelFiles
from service.config.settings import ConfigError, ServiceConfig
from service.http.auth import authorized, load_keys
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import exchange, parse_reply, post, request

BODY = {"prompt": "Hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def auth_server(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# team keys\nfile-key\n\n")
    service = ServiceConfig(port=0, api_keys=("key-one", "key-two"), api_key_file=str(key_file))
    server = LiveServer.start(sim_config(service), cached_builder(model_files))
    yield server
    server.close()


@pytest.mark.parametrize("header", [None, "Bearer wrong", "key-one", "Basic a2V5LW9uZQ==", "Bearer key-on"])
def test_missing_or_wrong_key_is_401(auth_server: LiveServer, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    reply = post(auth_server.url + "/v1/completions", BODY, headers)
    assert reply.status == 401 and reply.headers.get("WWW-Authenticate") == "Bearer"
    assert reply.error()["type"] == "authentication_error"
    assert request("GET", auth_server.url + "/v1/models", headers=headers).status == 401
    assert post(auth_server.url + "/tokenize", {"prompt": "hi"}, headers).status == 401
    assert post(auth_server.url + "/detokenize", {"tokens": [1]}, headers).status == 401


@pytest.mark.parametrize("key", ["key-one", "key-two", "file-key"])
def test_each_configured_key_works(auth_server: LiveServer, key: str) -> None:
    assert post(auth_server.url + "/v1/completions", BODY, {"Authorization": f"Bearer {key}"}).status == 200


def test_health_and_metrics_stay_open(auth_server: LiveServer) -> None:
    assert request("GET", auth_server.url + "/health").status == 200
    assert request("GET", auth_server.url + "/metrics").status == 200


def test_openai_client_sends_the_key(auth_server: LiveServer) -> None:
    good = OpenAI(base_url=auth_server.url + "/v1", api_key="key-two", max_retries=0)
    assert good.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2).choices
    bad = OpenAI(base_url=auth_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.models.list()


def test_authorized_unit() -> None:
    keys = (b"alpha", b"beta")
    assert authorized("Bearer beta", keys) and authorized("Bearer  alpha ", keys)
    assert authorized("bearer beta", keys) and authorized("BEARER\tbeta", keys) and authorized(" Bearer beta", keys)
    assert not authorized("Bearer gamma", keys) and not authorized(None, keys) and not authorized("beta", keys)
    assert not authorized("Bearer ", keys) and not authorized("Bearerbeta", keys)
    assert not authorized("Bearer \udcff\udcfe", keys) and not authorized("Bearer \ud800", keys)
    assert authorized("Bearer caf\udce9", (b"caf\xe9",))  # the bytes sent, compared as sent


@pytest.mark.parametrize("header", ["bearer key-one", "BEARER key-two", "Bearer    file-key  "])
def test_the_scheme_is_case_insensitive(auth_server: LiveServer, header: str) -> None:
    assert post(auth_server.url + "/v1/completions", BODY, {"Authorization": header}).status == 200


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"\xff\xfe", b"Bearer key-one\xff"])
def test_undecodable_authorization_bytes_are_401(auth_server: LiveServer, value: bytes,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    raw = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: " + value + b"\r\nConnection: close\r\n\r\n"
    reply = parse_reply(asyncio.run(exchange(auth_server.url, raw)))
    assert reply.status == 401 and reply.error()["code"] == "invalid_api_key"
    assert not [r for r in caplog.records if r.exc_info]
    assert post(auth_server.url + "/v1/completions", BODY, {"Authorization": "Bearer key-one"}).status == 200


def test_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_key_file"):
        load_keys(ServiceConfig(api_key_file=str(tmp_path / "absent")))
