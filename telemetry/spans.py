"""Span names and attribute builders: gen_ai.* semantic conventions, the OpenInference attributes that LLM
trace stores (Phoenix) read, and pagedserve.*."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from telemetry.interface import RequestRecord, StepRecord, TokenRecord
from telemetry.itl import SlowToken
from telemetry.tracker import RequestState

REQUEST_SPAN = "llm.request"
QUEUE_SPAN = "llm.request.queue"
PREFILL_SPAN = "llm.request.prefill"
DECODE_SPAN = "llm.request.decode"
STEP_SPAN = "llm.engine_step"
TOKEN_EVENT = "token"
SLOW_TOKEN_EVENT = "slow_token"
PREEMPTED_EVENT = "preempted"
PROMPT_EVENT = "gen_ai.content.prompt"
COMPLETION_EVENT = "gen_ai.content.completion"
Attributes = dict[str, Any]


def request_attributes(state: RequestState, default_model: str) -> Attributes:
    params, ctx = state.params, state.context
    model = ctx.model or default_model or "unknown"
    attrs: Attributes = {
        "gen_ai.operation.name": ctx.operation,
        "gen_ai.system": "pagedserve",
        "gen_ai.request.model": model,
        "openinference.span.kind": "LLM",
        "llm.model_name": model,
        "pagedserve.request.id": state.request_id,
        "gen_ai.usage.input_tokens": state.prompt_tokens,
    }
    if ctx.request_id is not None:
        attrs["http.request.header.x-request-id"] = (ctx.request_id,)
    for key, name in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                      ("top_k", "top_k"), ("seed", "seed"), ("n", "choice.count")):
        value = getattr(params, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[f"gen_ai.request.{name}"] = value
    return attrs


def finish_attributes(state: RequestState, record: RequestRecord) -> Attributes:
    attrs: Attributes = {
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.output_tokens": record.completion_tokens,
        "llm.token_count.prompt": record.prompt_tokens,
        "llm.token_count.completion": record.completion_tokens,
        "llm.token_count.total": record.prompt_tokens + record.completion_tokens,
        "gen_ai.response.finish_reasons": tuple(record.finish_reason.split(",")),
        "pagedserve.cached_tokens": record.cached_tokens,
        "pagedserve.e2e_s": record.finished - state.queued_at,
        "pagedserve.preemptions": state.preemptions,
        "pagedserve.prefill_chunks": state.chunks,
        "pagedserve.slow_tokens": sum(state.slow.values()),
    }
    for cause, count in state.slow.items():
        attrs[f"pagedserve.slow_tokens.{cause}"] = count
    if state.first_scheduled is not None:
        attrs["pagedserve.queue_time_s"] = state.first_scheduled - state.queued_at
    if state.first_token is not None:
        attrs["pagedserve.ttft_s"] = state.first_token - state.queued_at
        if state.first_scheduled is not None:
            attrs["pagedserve.prefill_time_s"] = state.first_token - state.first_scheduled
    if state.first_token is not None and state.last_token is not None:
        attrs["pagedserve.decode_time_s"] = state.last_token - state.first_token
    return attrs


def input_attributes(prompt: str) -> Attributes:
    return {"input.value": prompt, "input.mime_type": "text/plain"}


def output_attributes(completions: Sequence[str]) -> Attributes:
    """One choice: its text; several: a JSON array of their texts, in choice order."""
    if len(completions) == 1:
        return {"output.value": completions[0], "output.mime_type": "text/plain"}
    return {"output.value": json.dumps(list(completions)), "output.mime_type": "application/json"}


def token_attributes(index: int, step: StepRecord, record: TokenRecord, gap: float, slow: SlowToken | None
                     ) -> Attributes:
    attrs: Attributes = {
        "pagedserve.token.index": index,
        "pagedserve.step.id": step.step_id,
        "pagedserve.token.gap_s": gap,
        "pagedserve.step.batch_size": record.batch_size,
        "pagedserve.step.prefill_tokens": record.prefill_tokens,
    }
    if slow is not None:
        attrs["pagedserve.slow_token.cause"] = slow.cause
    return attrs


def slow_token_attributes(index: int, step: StepRecord, slow: SlowToken) -> Attributes:
    return {
        "pagedserve.token.index": index,
        "pagedserve.step.id": step.step_id,
        "pagedserve.slow_token.cause": slow.cause,
        "pagedserve.token.gap_s": slow.gap,
        "pagedserve.slow_token.median_gap_s": slow.median,
        "pagedserve.slow_token.threshold_s": slow.threshold,
        "pagedserve.slow_token.wait_s": slow.wait,
        "pagedserve.step.duration_s": slow.step_duration,
        "pagedserve.step.prefill_tokens": slow.prefill_tokens,
    }


def step_attributes(step: StepRecord, tokens: int, request_spans: Sequence[int]) -> Attributes:
    """request_spans: the span ids of the request spans the step links to, also as an attribute (hex) for the
    stores that keep no links (Phoenix drops them at ingestion)."""
    return {
        "pagedserve.step.request_spans": tuple(f"{span_id:016x}" for span_id in request_spans),
        "pagedserve.step.output_tokens": tokens,
        "pagedserve.step.id": step.step_id,
        "pagedserve.step.batch_size": step.num_seqs,
        "pagedserve.step.prefill_tokens": step.prefill_tokens,
        "pagedserve.step.decode_tokens": step.decode_tokens,
        "pagedserve.step.guessed_tokens": step.guessed_tokens,
        "pagedserve.step.kv_usage": step.kv_usage,
        "pagedserve.step.num_running": step.num_running,
        "pagedserve.step.num_waiting": step.num_waiting,
        "pagedserve.step.preemptions": step.preemptions,
    }
