"""A request's sampling fields as the scheduler's SamplingParams, refusing what is not supported, with the one
grammar its constrained-decoding fields (OpenAI's response_format, vLLM's guided_*) compile to: the params'
`guide` (compiled first, off the event loop, then passed to `completion_params` / `chat_params`)."""

from __future__ import annotations

import json
from typing import Any

from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideFactory, GuideKind, GuideSpec
from scheduler.params import SamplingParams
from service.openai.errors import bad_request, from_engine
from service.openai.schemas.requests import ChatRequest, CommonRequest, CompletionRequest, ResponseFormat

# Request field -> SamplingParams field, copied when the client set it (None keeps the default).
_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
             "repetition_penalty")
ANY_OBJECT: dict[str, Any] = {"type": "object"}
_PLAIN: tuple[tuple[str, GuideKind], ...] = (("guided_regex", "regex"), ("guided_choice", "choice"),
                                             ("guided_grammar", "lark"))


def completion_params(req: CompletionRequest, guide: GuideSpec | None = None) -> SamplingParams:
    _refuse(bool(req.echo), "echo")
    _refuse(req.suffix is not None, "suffix")
    _refuse(req.best_of is not None and req.best_of != req.n, "best_of")
    logprobs = req.logprobs is not None
    if logprobs and (req.logprobs or 0) < 0:
        raise bad_request("logprobs must be non-negative", "logprobs")
    return _params(req, req.max_tokens, logprobs, req.logprobs or 0, {"top_logprobs": "logprobs"}, guide)


def chat_params(req: ChatRequest, guide: GuideSpec | None = None) -> SamplingParams:
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    renames = {"max_tokens": "max_completion_tokens"} if req.max_completion_tokens is not None else {}
    return _params(req, max_tokens, bool(req.logprobs), req.top_logprobs or 0, renames, guide)


def _params(req: CommonRequest, max_tokens: int | None, logprobs: bool, top_logprobs: int,
            renames: dict[str, str], guide: GuideSpec | None) -> SamplingParams:
    """`renames` maps a SamplingParams field to the request field the client set (for error messages)."""
    _refuse(bool(req.logit_bias), "logit_bias")
    kwargs: dict[str, Any] = {k: getattr(req, k) for k in _OPTIONAL if getattr(req, k) is not None}
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        return SamplingParams(
            **kwargs, max_tokens=max_tokens, min_tokens=req.min_tokens, stop=stop,
            stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=req.ignore_eos, logprobs=logprobs,
            top_logprobs=top_logprobs, n=req.n, skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output, guide=guide)
    except InvalidRequestError as exc:
        message, param = str(exc), exc.param
        if param in renames:
            message, param = message.replace(param, renames[param]), renames[param]
        raise bad_request(message, param) from None


def _refuse(condition: bool, field: str) -> None:
    if condition:
        raise bad_request(f"'{field}' is not supported by this server", field, "unsupported_parameter")


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
