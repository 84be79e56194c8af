"""CORS: off by default; an allowed origin gets the headers (streams too) and its preflight answered, a
refused one gets neither; "*" never allows credentials."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.model.loader import ModelFiles
from service.config.settings import ConfigError, ServiceConfig, load_config
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import Reply, post, request

CMPL = "/v1/completions"
APP = "https://app.example.com"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def headers(reply: Reply) -> dict[str, str]:
    return {k.lower(): v for k, v in reply.headers.items()}


def _server(model_files: ModelFiles, *origins: str) -> LiveServer:
    config = ServiceConfig(port=0, cors_allow_origins=origins, api_keys=("sk-test",))
    return LiveServer.start(sim_config(config), cached_builder(model_files))


@pytest.fixture(scope="module")
def listed(model_files: ModelFiles) -> Iterator[LiveServer]:
    server = _server(model_files, APP, "http://localhost:3000")
    yield server
    server.close()


@pytest.fixture(scope="module")
def wildcard(model_files: ModelFiles) -> Iterator[LiveServer]:
    server = _server(model_files, "*")
    yield server
    server.close()


AUTH = {"Authorization": "Bearer sk-test"}


def test_off_by_default(sim_server: LiveServer) -> None:
    reply = post(sim_server.url + CMPL, {"prompt": "hi", "max_tokens": 1}, {"Origin": APP})
    assert reply.status == 200 and not [k for k in headers(reply) if k.startswith("access-control")]
    preflight = request("OPTIONS", sim_server.url + CMPL, headers={"Origin": APP, **PREFLIGHT})
    assert preflight.status == 405 and "access-control-allow-origin" not in headers(preflight)


def test_preflight_of_an_allowed_origin(listed: LiveServer) -> None:
    reply = request("OPTIONS", listed.url + CMPL, headers={"Origin": APP, **PREFLIGHT})  # no key: before auth
    got = headers(reply)
    assert reply.status == 204
    assert got["access-control-allow-origin"] == APP and got["access-control-allow-credentials"] == "true"
    assert "POST" in got["access-control-allow-methods"]
    assert "authorization" in got["access-control-allow-headers"].lower() and "Origin" in got["vary"]


def test_preflight_of_a_refused_origin_is_403(listed: LiveServer) -> None:
    reply = request("OPTIONS", listed.url + CMPL, headers={"Origin": "https://evil.example", **PREFLIGHT})
    assert reply.status == 403 and reply.error()["code"] == "cors_origin_refused"
    assert "access-control-allow-origin" not in headers(reply)


def test_an_allowed_origin_gets_the_headers_on_answers_and_streams(listed: LiveServer) -> None:
    for body in ({"prompt": "hi", "max_tokens": 1}, {"prompt": "hi", "max_tokens": 2, "stream": True}):
        reply = post(listed.url + CMPL, body, {"Origin": "http://localhost:3000", **AUTH})
        got = headers(reply)
        assert reply.status == 200 and got["access-control-allow-origin"] == "http://localhost:3000"
        assert "X-Request-Id" in got["access-control-expose-headers"]


def test_errors_to_an_allowed_origin_are_readable(listed: LiveServer) -> None:
    reply = post(listed.url + CMPL, {"prompt": "hi"}, {"Origin": APP})  # no key: 401
    assert reply.status == 401 and headers(reply)["access-control-allow-origin"] == APP


def test_a_refused_origin_gets_no_headers(listed: LiveServer) -> None:
    reply = post(listed.url + CMPL, {"prompt": "hi", "max_tokens": 1}, {"Origin": "https://evil.example", **AUTH})
    assert reply.status == 200 and not [k for k in headers(reply) if k.startswith("access-control")]


def test_wildcard_allows_any_origin_without_credentials(wildcard: LiveServer) -> None:
    reply = post(wildcard.url + CMPL, {"prompt": "hi", "max_tokens": 1}, {"Origin": "https://x.test", **AUTH})
    got = headers(reply)
    assert got["access-control-allow-origin"] == "*" and "access-control-allow-credentials" not in got
    preflight = request("OPTIONS", wildcard.url + CMPL, headers={"Origin": "https://y.test", **PREFLIGHT})
    assert preflight.status == 204 and "access-control-allow-credentials" not in headers(preflight)


def test_a_plain_options_is_not_a_preflight(listed: LiveServer) -> None:
    reply = request("OPTIONS", listed.url + CMPL, headers={"Origin": APP, **AUTH})
    assert reply.status == 405 and reply.error()["type"] == "invalid_request_error"


def test_the_setting_from_env_and_its_bad_values() -> None:
    config = load_config(None, {"PAGEDSERVE_CORS_ALLOW_ORIGINS": f"{APP}, http://localhost:3000"})
    assert config.service.cors_allow_origins == (APP, "http://localhost:3000")
    for bad in ("app.example.com", "https://app.example.com/", "https://a.test/path", "ftp://a.test"):
        with pytest.raises(ConfigError, match="cors_allow_origins"):
            load_config(None, {"PAGEDSERVE_CORS_ALLOW_ORIGINS": bad})
