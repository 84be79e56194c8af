"""GET /openapi.json: a valid OpenAPI 3.1 document, generated from the msgspec Structs, that the server keeps
to: schemathesis sends it requests generated from the document (valid ones and invalid ones) and checks that
no answer is a 5xx and that every status and body is one the document lists."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from backends.model.loader import ModelFiles
from service.app.openapi import OPERATIONS, Operation, openapi_document
from service.app.server import create_app
from service.config.settings import AppConfig, ServiceConfig
from service.generation.state import Runtime
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import request

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]
EXAMPLES = 25  # per operation: enough to reach every field, a few seconds with the sim backend


@pytest.fixture(scope="module")
def document(sim_server: LiveServer) -> dict[str, Any]:
    reply = request("GET", sim_server.url + "/openapi.json")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
    return reply.json()


def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    assert document["info"]["title"] == "pagedserve" and document["info"]["version"]
    schemathesis.openapi.from_dict(document).validate()  # raises on any violation of the 3.1 meta-schema
    assert {(op.method, op.path) for op in OPERATIONS} == {
        (method, path) for path, item in document["paths"].items() for method in item}


def test_the_validator_rejects_a_broken_document(document: dict[str, Any]) -> None:
    broken = {**document, "paths": {"/health": {"get": {"responses": {"200": {"content": []}}}}}}
    with pytest.raises(ValueError, match="content"):  # jsonschema_rs.ValidationError, a ValueError
        schemathesis.openapi.from_dict(broken).validate()


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.request is not None], ids=lambda op: op.path)
def test_request_schema_has_every_field(document: dict[str, Any], op: Operation) -> None:
    """Generated, not written: every field of the Struct, required exactly when it has no default."""
    struct = op.request
    assert struct is not None
    body = document["paths"][op.path][op.method]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    fields = msgspec.structs.fields(struct)
    assert set(schema["properties"]) == {f.encode_name for f in fields}
    assert set(schema.get("required", ())) == {f.encode_name for f in fields if f.required}
    assert schema["additionalProperties"] is False  # unknown fields get 400 (forbid_unknown_fields)


def test_api_keys_add_bearer_security() -> None:
    assert "securitySchemes" not in openapi_document(sim_config())["components"]
    keyed = openapi_document(sim_config(ServiceConfig(port=0, api_keys=("key",))))
    assert keyed["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    secured = {path for path, item in keyed["paths"].items() if all("security" in op for op in item.values())}
    assert secured == {path for path in keyed["paths"] if path.startswith("/v1/")} | {"/tokenize", "/detokenize"}


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[LiveServer]:
    """A server with an API key whose model never loads: enough for routes that need no runtime."""
    async def never(config: AppConfig) -> Runtime:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    server = LiveServer(create_app(sim_config(ServiceConfig(port=0, api_keys=("key",))), never))
    yield server
    server.close()


def test_document_needs_no_key(keyed_server: LiveServer) -> None:
    assert request("GET", keyed_server.url + "/v1/models").status == 401
    reply = request("GET", keyed_server.url + "/openapi.json")
    assert reply.status == 200 and "bearer" in reply.json()["components"]["securitySchemes"]


@pytest.fixture(scope="module")
def short_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    """The sim server with a short context: a chat request without max_tokens generates up to the context,
    and at the model's 8192 tokens a few such requests would take most of a minute."""
    config = sim_config(ServiceConfig(port=0, max_body_bytes=64 * 1024), max_model_len=256)
    server = LiveServer.start(config, cached_builder(model_files))
    yield server
    server.close()


# Loaded from the document the sim server serves (same types, same model), not from the server itself:
# schemathesis.pytest.from_fixture reads a private pytest attribute that pytest 9 no longer has.
schema = schemathesis.openapi.from_dict(openapi_document(sim_config()))


def test_schemathesis_tests_the_served_document(document: dict[str, Any]) -> None:
    assert document == schema.raw_schema


CHAT = [{"role": "user", "content": "Hi"}]
GOOD = [  # the success paths, which generated bodies seldom reach (most are refused with 400), streams included
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "logprobs": 2}),
    ("/v1/completions", {"prompt": ["Hi", "Yo"], "max_tokens": 4, "n": 2, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "stream": True, "logprobs": True}),
    ("/tokenize", {"prompt": "Hi", "return_token_strs": True}),
    ("/tokenize", {"messages": CHAT}),
    ("/detokenize", {"tokens": [1, 2, 3]}),
]


@pytest.mark.parametrize(("path", "body"), GOOD)
def test_good_requests_get_documented_answers(short_server: LiveServer, path: str, body: dict[str, Any]) -> None:
    response = schema[path]["POST"].Case(body=body).call_and_validate(base_url=short_server.url, checks=CHECKS)
    assert response.status_code == 200


def test_a_stream_is_checked_event_by_event(short_server: LiveServer) -> None:
    """Each SSE event's JSON is held to its chunk schema: a document that asks for more fails the check."""
    stricter = copy.deepcopy(schema.raw_schema)
    stricter["components"]["schemas"]["CompletionChunk"]["required"].append("not_sent")
    case = schemathesis.openapi.from_dict(stricter)["/v1/completions"]["POST"].Case(
        body={"prompt": "Hi", "max_tokens": 2, "stream": True})
    with pytest.raises(FailureGroup) as raised:
        case.call_and_validate(base_url=short_server.url, checks=CHECKS)
    assert [failure.title for failure in raised.value.exceptions] == ["SSE event violates schema"]


@schema.parametrize()
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_server_keeps_to_its_document(case: Any, short_server: LiveServer) -> None:
    case.call_and_validate(base_url=short_server.url, checks=CHECKS)
