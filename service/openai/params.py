"""Map a request's sampling fields to the scheduler's SamplingParams, refusing what is not supported."""

from __future__ import annotations

from typing import Any

from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideSpec
from scheduler.params import SamplingParams
from service.openai.errors import bad_request
from service.openai.schemas.requests import ChatRequest, CommonRequest, CompletionRequest

# Request field -> SamplingParams field, copied when the client set it (None keeps the default).
_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
             "repetition_penalty")


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
