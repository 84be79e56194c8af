"""The OpenAPI 3.1 document of the API (GET /openapi.json), generated from the msgspec Structs the handlers
decode and encode, so it cannot drift from them. It depends on the types and the config alone (the served
model's name, whether API keys are on), so the app builds it once, as it is made.

Adding an operation is one line of OPERATIONS."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
import msgspec.inspect as mi

from service.app.assemble import model_name
from service.app.openapi_rules import add_rules
from service.config.settings import AppConfig
from service.http.auth import load_keys, needs_key
from service.openai.schemas.errors import ErrorBody
from service.openai.schemas.requests import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from service.openai.schemas.responses import (
    ChatChunk,
    ChatCompletion,
    Completion,
    CompletionChunk,
    DetokenizeResponse,
    Health,
    ModelCard,
    ModelList,
    TokenizeResponse,
)

OPENAPI_VERSION = "3.1.0"
REF = "#/components/schemas/{name}"
JSON = "application/json"
SSE = "text/event-stream"
BEARER = "bearer"
# What a route that reads a JSON body may answer besides 200, each with ErrorBody (service/http/body.py,
# service/openai/errors.py); 401 is added where a key is needed
BODY_ERRORS = (400, 404, 408, 413, 415, 422, 429, 503, 504)
STATUS_TEXT = {200: "OK", 400: "Invalid request", 401: "Missing or wrong API key", 404: "No such model",
               408: "The body did not arrive in time", 413: "Body too large", 415: "Not a JSON body",
               422: "Unprocessable request", 429: "Too many requests", 503: "Loading, overloaded or shutting down",
               504: "Generation timed out"}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    request: type[msgspec.Struct] | None  # the JSON body; None: no body
    response: type[msgspec.Struct]  # the 200 body
    chunk: type[msgspec.Struct] | None = None  # each SSE event's JSON when the request asks for "stream": true
    errors: tuple[int, ...] = BODY_ERRORS
    error: type[msgspec.Struct] = ErrorBody  # the body of the error statuses


OPERATIONS = (
    Operation("post", "/v1/completions", "Create a completion", CompletionRequest, Completion, CompletionChunk),
    Operation("post", "/v1/chat/completions", "Create a chat completion", ChatRequest, ChatCompletion, ChatChunk),
    Operation("get", "/v1/models", "List the served model", None, ModelList, errors=()),
    Operation("get", "/v1/models/{model}", "Retrieve the served model", None, ModelCard, errors=(404,)),
    Operation("get", "/health", "Readiness: 200 while serving, 503 otherwise (degraded, loading, draining, failed)",
              None, Health, errors=(503,), error=Health),
    Operation("get", "/health/live", "Liveness: 200 unless the engine or the model load failed", None, Health,
              errors=(503,), error=Health),
    Operation("post", "/tokenize", "The token ids of a prompt or a conversation (vLLM's)", TokenizeRequest,
              TokenizeResponse),
    Operation("post", "/detokenize", "The text of token ids (vLLM's)", DetokenizeRequest, DetokenizeResponse),
)


def openapi_document(config: AppConfig) -> dict[str, Any]:
    keyed = bool(load_keys(config.service))
    name = model_name(config)
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, name, keyed)
    document: dict[str, Any] = {"openapi": OPENAPI_VERSION, "info": _info(name), "paths": paths,
                                "components": _components(config)}
    if keyed:
        document["components"]["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer"}}
    return document


def _info(name: str) -> dict[str, Any]:
    try:
        release = version("pagedserve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        release = "0+unknown"
    return {"title": "pagedserve", "version": release,
            "description": f"An OpenAI-compatible API serving the model `{name}`."}


def _operation(op: Operation, name: str, keyed: bool) -> dict[str, Any]:
    guarded = keyed and needs_key(op.path)  # what service.http.middleware.auth_middleware guards
    spec: dict[str, Any] = {"summary": op.summary, "operationId": _operation_id(op),
                            "responses": _responses(op, (401,) if guarded else ())}
    if op.request is not None:
        spec["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(op.request)}}}
    if "{model}" in op.path:
        spec["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                               "example": name}]
    if guarded:
        spec["security"] = [{BEARER: []}]
    return spec


def _operation_id(op: Operation) -> str:
    words = op.path.replace("{", "").replace("}", "").replace("/", " ").replace("_", " ").split()
    return op.method + "".join(word.capitalize() for word in words)


def _responses(op: Operation, auth_errors: tuple[int, ...]) -> dict[str, Any]:
    ok = {JSON: {"schema": _ref(op.response)}}
    if op.chunk is not None:
        ok[SSE] = {"schema": _event_schema(op.chunk)}
    responses = {"200": {"description": STATUS_TEXT[200], "content": ok}}
    for status in sorted(op.errors + auth_errors):
        responses[str(status)] = {"description": STATUS_TEXT[status], "content": {JSON: {"schema": _ref(op.error)}}}
    return responses


def _event_schema(chunk: type[msgspec.Struct]) -> dict[str, Any]:
    """One Server-Sent Event (before 3.2, an SSE media type's schema is one event's): `data: [DONE]` ends the
    stream; any other event's data is a chunk, or the error that ended the stream after its headers went out."""
    payload = {"anyOf": [_ref(chunk), _ref(ErrorBody)]}
    json_data = {"type": "string", "contentMediaType": JSON, "contentSchema": payload}
    return {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
            "if": {"properties": {"data": {"const": "[DONE]"}}}, "else": {"properties": {"data": json_data}}}


def _ref(struct: type[msgspec.Struct]) -> dict[str, str]:
    return {"$ref": REF.format(name=struct.__name__)}


def _components(config: AppConfig) -> dict[str, Any]:
    types = list(dict.fromkeys(t for op in OPERATIONS for t in (op.request, op.response, op.chunk, op.error) if t))
    _, schemas = msgspec.json.schema_components(types, ref_template=REF)
    # msgspec leaves out that a forbid_unknown_fields Struct refuses other fields (with 400): say so
    for struct in _structs(mi.multi_type_info(types)):
        if struct.forbid_unknown_fields:
            schemas[struct.cls.__name__]["additionalProperties"] = False
    add_rules(schemas, config)  # what the server's code refuses beyond the types
    return {"schemas": schemas}


def _structs(types: tuple[mi.Type, ...], seen: set[type] | None = None) -> Iterator[mi.StructType]:
    """Every Struct reachable from `types`, once each (through fields, unions, containers)."""
    seen = set() if seen is None else seen
    for t in types:
        if isinstance(t, mi.StructType) and t.cls not in seen:
            seen.add(t.cls)
            yield t
            yield from _structs(tuple(f.type for f in t.fields), seen)
        for attr in ("types", "item_type", "item_types", "key_type", "value_type"):
            inner = getattr(t, attr, None)
            if inner is not None:
                yield from _structs(inner if isinstance(inner, tuple) else (inner,), seen)
