"""What /openapi.json allows, the server serves: schemathesis generates valid requests only (positive mode) from
the served document for the generation, token and model routes, and every answer is a 200, or a 404 for a model
name the server does not serve; never a 400, never a 5xx.

The generated values are narrowed here only where JSON Schema cannot state the server's rule (NARROWED, each
with its reason, and each said in the document's descriptions); anything else the server refused would be a
document that allows too much."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.generation.modes import GenerationMode

from backends.model.loader import ModelFiles
from service.app.openapi import openapi_document
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import request

Schema = dict[str, Any]
CONFIG = sim_config(ServiceConfig(port=0))  # the model's 8192-token context: the prompts generated fit
EXAMPLES = 100  # per operation: about 10 s in all on 2 cores, the explicit (coverage) examples included
SMALL_ID: Schema = {"type": "integer", "minimum": 0, "maximum": 1000}  # below any vocabulary size
FEW_TOKENS: Schema = {"type": "integer", "minimum": 1, "maximum": 8}  # the prompt plus them within the context
# text SmolLM2 can write: no token holds bytes 04, 06, 13, 14, 16 or 1D, nor F1 and F2 (planes 4 to 11's lead bytes)
WRITABLE: Schema = {"type": "string", "minLength": 1,
                    "pattern": "^[^\x04\x06\x13\x14\x16\x1d\U00040000-\U000bffff]+$"}
CHOICES: Schema = {"anyOf": [{"type": "array", "minItems": 1, "items": WRITABLE}, {"type": "null"}]}
# (schema, property) -> what is generated instead, where JSON Schema cannot say the server's rule
NARROWED: dict[tuple[str, str], Schema] = {
    ("CompletionRequest", "max_tokens"): FEW_TOKENS,  # fits the context: depends on the prompt's token count
    ("ChatRequest", "max_tokens"): FEW_TOKENS,
    ("ChatRequest", "max_completion_tokens"): {"anyOf": [FEW_TOKENS, {"type": "null"}]},
    ("CompletionRequest", "min_tokens"): {"type": "integer", "minimum": 0, "maximum": 1},  # at most max_tokens
    ("ChatRequest", "min_tokens"): {"type": "integer", "minimum": 0, "maximum": 1},
    ("CompletionRequest", "stop_token_ids"): {"anyOf": [{"type": "array", "items": SMALL_ID}, {"type": "null"}]},
    ("ChatRequest", "stop_token_ids"): {"anyOf": [{"type": "array", "items": SMALL_ID}, {"type": "null"}]},
    ("DetokenizeRequest", "tokens"): {"type": "array", "items": SMALL_ID},
    ("CompletionRequest", "guided_choice"): CHOICES,  # each choice must be text the model can write
    ("ChatRequest", "guided_choice"): CHOICES,
    ("ChatRequest", "tools"): {"type": "null"},  # each function's parameters must compile as a grammar
    # a tool message must answer a call of the assistant message before it, and every call be answered
    ("ChatMessage", "role"): {"enum": ["system", "developer", "user", "assistant"]},
    ("ChatMessage", "tool_calls"): {"type": "null"},
    ("TokenizeRequest", "continue_final_message"): {"const": False},  # the last message's content is non-empty
    ("TokenizeRequest", "tools"): {"type": "null"},
}
GRAMMARS = ("guided_json", "guided_regex", "guided_grammar")  # must compile: never generated
OPERATIONS = r"^/(v1/completions|v1/chat/completions|tokenize|detokenize|v1/models.*)$"


def narrowed(document: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(document)
    schemas = out["components"]["schemas"]
    for (name, prop), schema in NARROWED.items():
        schemas[name]["properties"][prop] = schema
    for name in ("CompletionRequest", "ChatRequest"):
        for prop in GRAMMARS:
            schemas[name]["properties"][prop] = {"type": "null"}
        # a json_schema must compile too; a max_tokens always, or a chat runs to the context
        schemas[name]["properties"]["response_format"] = {"anyOf": [{"type": "null"}, {
            "type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"],
            "additionalProperties": False}]}
        schemas[name]["required"] = [*schemas[name].get("required", ()), "max_tokens"]
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    prompt[2]["items"] = prompt[3]["items"]["items"] = SMALL_ID  # token ids below the vocabulary size
    return out


def spelt_as_integers(value: Any) -> Any:
    """JSON Schema cannot tell 1.0 from 1 (both are integers to it), and the generator sends both; the server's
    decoder wants an integer field spelt as one (1.0 is refused, as a fractional count would be). A float field
    takes 1 as well as 1.0, so every integral float goes out as an integer."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [spelt_as_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: spelt_as_integers(v) for k, v in value.items()}
    return value


schema = schemathesis.openapi.from_dict(narrowed(openapi_document(CONFIG))).include(path_regex=OPERATIONS)
schema.config.generation.update(modes=[GenerationMode.POSITIVE])


@pytest.fixture(scope="module")
def server(model_files: ModelFiles) -> Iterator[LiveServer]:
    live = LiveServer.start(CONFIG, cached_builder(model_files))
    yield live
    live.close()


def test_the_narrowed_document_is_the_served_one_narrowed(server: LiveServer) -> None:
    served = request("GET", server.url + "/openapi.json").json()
    assert narrowed(served) == narrowed(openapi_document(CONFIG))


@schema.parametrize()
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_what_the_document_allows_is_served(case: Any, server: LiveServer) -> None:
    case.body = spelt_as_integers(case.body)
    response = case.call(base_url=server.url)
    assert response.status_code in (200, 404), (case.path, case.body, response.text[:500])
