"""What the server refuses beyond the request types: rules added to the OpenAPI document's request schemas, so
that a request the document allows is one the server serves.

Each Struct's own schema (msgspec's) says what one field may hold; the checks here are made by code instead:
fields accepted only in part (`echo`, `suffix`, `logit_bias`, `best_of`), rules across fields (one constraint at
most, `best_of` equal to `n`, `top_logprobs` needing `logprobs`, a forced tool needing tools, /tokenize's prompt or
messages) and the prompt's four forms (a union msgspec cannot type). What JSON Schema cannot say at all (a prompt
plus max_tokens within the context, min_tokens at most max_tokens, a grammar that compiles, token ids below the
vocabulary size, prompts x n at most 128) is in the fields' descriptions.
"""

from __future__ import annotations

from typing import Any

from scheduler.params import MAX_N
from service.config.settings import AppConfig
from service.routes.common import MAX_CHOICES

Schema = dict[str, Any]
NULL: Schema = {"type": "null"}
CONSTRAINTS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
TOKEN_ID: Schema = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
DESCRIPTIONS = {
    "max_tokens": "The prompt's tokens plus max_tokens must fit the context length (and the KV cache).",
    "min_tokens": "At most max_tokens.",
    "stop_token_ids": "Token ids below the model's vocabulary size.",
    "guided_json": "A JSON schema the grammar engine can compile; at most one of response_format and guided_*.",
    "guided_regex": "A regular expression that matches some string; at most one of response_format and guided_*.",
    "guided_grammar": "A Lark grammar that compiles; at most one of response_format and guided_*.",
    "guided_choice": "Choices the model can write (a choice holding a byte that no token holds is refused); at most "
                     "one of response_format and guided_*.",
    "response_format": "A json_schema the grammar engine can compile; at most one of response_format and guided_*.",
}


def add_rules(schemas: dict[str, Schema], config: AppConfig) -> None:
    max_n = min(MAX_N, config.scheduler.max_num_seqs)
    for name in ("CompletionRequest", "ChatRequest"):
        _common(schemas[name], max_n)
    _completion(schemas["CompletionRequest"], max_n)
    _chat(schemas["ChatRequest"])
    _tokenize(schemas["TokenizeRequest"])
    schemas["ResponseFormat"].setdefault("allOf", []).append(
        _when({"type": {"const": "json_schema"}},
              {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}}))
    schemas["DetokenizeRequest"]["properties"]["tokens"]["description"] = "Token ids below the vocabulary size."


def _common(schema: Schema, max_n: int) -> None:
    props = schema["properties"]
    props["n"]["maximum"] = max_n  # a step holds at most max_num_seqs sequences
    props["logit_bias"] = {"anyOf": [{"type": "object", "maxProperties": 0}, NULL], "default": None,
                           "description": "Not supported: only an empty map is accepted."}
    for field, text in DESCRIPTIONS.items():
        if field in props:
            props[field]["description"] = text
    # at most one asks for a grammar: for one of them, all the others ask for none
    schema.setdefault("allOf", []).append({"anyOf": [
        {"properties": {other: _quiet(other) for other in CONSTRAINTS if other != field}} for field in CONSTRAINTS]})


def _completion(schema: Schema, max_n: int) -> None:
    props = schema["properties"]
    props["echo"] = {"enum": [False, None], "default": False, "description": "Not supported: false only."}
    props["suffix"] = {**NULL, "default": None, "description": "Not supported."}
    # best_of equal to n, stated for n = 1 only: the 16 cases of best_of = n = k, beside the one-constraint
    # rule, are more branches than a test generator (schemathesis) takes; the server accepts them all
    props["best_of"] = {"anyOf": [{"const": 1}, NULL], "default": None,
                        "description": "Accepted only when equal to n (no extra candidates are generated)."}
    texts = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
             "maxItems": MAX_CHOICES // max_n}
    batches = {"type": "array", "items": {"type": "array", "items": TOKEN_ID, "minItems": 1}, "minItems": 1,
               "maxItems": MAX_CHOICES // max_n}
    props["prompt"] = {
        "anyOf": [{"type": "string", "minLength": 1}, texts, {"type": "array", "items": TOKEN_ID, "minItems": 1},
                  batches],
        "description": f"A text, texts, token ids or lists of token ids (not a mixture); token ids below the "
                       f"vocabulary size; at most {MAX_CHOICES} choices (prompts x n) in all."}
    schema["allOf"].append(_when({"best_of": {"const": 1}}, {"properties": {"n": {"const": 1}}}))


def _chat(schema: Schema) -> None:
    schema["allOf"] += [
        _when({"top_logprobs": {"type": "integer", "minimum": 1}},
              {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}, required=["top_logprobs"]),
        _when({"tool_choice": {"anyOf": [{"enum": ["auto", "required"]}, {"type": "object"}]}},
              {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
              required=["tool_choice"]),
    ]
    schema["properties"]["tools"]["description"] = ("Function names unique; a named tool_choice names one of them; "
                                                    "each function's parameters a JSON schema the grammar engine "
                                                    "can compile.")


def _tokenize(schema: Schema) -> None:
    given = [{"properties": {field: {"type": kind}}, "required": [field]}
             for field, kind in (("prompt", "string"), ("messages", "array"))]
    schema["allOf"] = [
        {"oneOf": given},  # exactly one of prompt and messages
        _when({"continue_final_message": {"const": True}},
              {"properties": {"add_generation_prompt": {"const": False}}, "required": ["add_generation_prompt"]},
              required=["continue_final_message"]),
    ]
    schema["properties"]["add_special_tokens"]["description"] = (
        "With messages, only for a tokenizer without a post-processor (GGUF models).")


def _quiet(field: str) -> Schema:
    """The values of `field` that ask for no grammar (absent is one too): null, and response_format's "text"."""
    if field == "response_format":
        return {"anyOf": [NULL, {"type": "object", "properties": {"type": {"const": "text"}}}]}
    return NULL


def _when(condition: Schema, then: Schema, required: list[str] | None = None) -> Schema:
    return {"if": {"properties": condition, "required": required or list(condition)}, "then": then}
