"""A request's constrained-decoding fields (OpenAI's response_format, vLLM's guided_*) as one grammar."""

from __future__ import annotations

import json
from typing import Any

from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideFactory, GuideKind, GuideSpec
from service.openai.errors import bad_request, from_engine
from service.openai.schemas.requests import CommonRequest, ResponseFormat

ANY_OBJECT: dict[str, Any] = {"type": "object"}
_PLAIN: tuple[tuple[str, GuideKind], ...] = (("guided_regex", "regex"), ("guided_choice", "choice"),
                                             ("guided_grammar", "lark"))


def guide_of(req: CommonRequest, guides: GuideFactory | None) -> GuideSpec | None:
    """The request's grammar, compiled; None when it asks for none. A bad one is a 400 naming its field."""
    asked = _constraints(req)
    if not asked:
        return None
    if len(asked) > 1:
        names = ", ".join(param for param, _, _ in asked)
        raise bad_request(f"at most one constraint per request, not {names}", asked[1][0])
    param, kind, value = asked[0]
    value = _json_value(value, param) if param == "guided_json" else value
    if guides is None:
        raise bad_request("constrained decoding is not available on this server", param, "unsupported_parameter")
    try:
        return guides.compile(kind, value, param)
    except InvalidRequestError as exc:
        raise from_engine(exc) from None


def has_constraint(req: CommonRequest) -> bool:
    """Whether the request asks for any constraint (nothing parsed or compiled)."""
    return bool(_constraints(req))


def _constraints(req: CommonRequest) -> list[tuple[str, GuideKind, Any]]:
    found: list[tuple[str, GuideKind, Any]] = []
    if req.response_format is not None and req.response_format.type != "text":
        found.append(("response_format", "json_schema", _response_schema(req.response_format)))
    if req.guided_json is not None:
        found.append(("guided_json", "json_schema", req.guided_json))
    for param, kind in _PLAIN:
        value = getattr(req, param)
        if value is not None:
            found.append((param, kind, value))
    return found


def _response_schema(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return ANY_OBJECT
    if fmt.json_schema is None:
        raise bad_request("response_format of type json_schema needs a json_schema", "response_format")
    return fmt.json_schema.schema if fmt.json_schema.schema is not None else ANY_OBJECT


def _json_value(value: dict[str, Any] | str, param: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise bad_request(f"{param} is not valid JSON: {exc}", param) from None
