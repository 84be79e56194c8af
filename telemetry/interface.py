"""The thin interface through which the engine reports what happens; telemetry implements it.

Plain data in, nothing returned: the engine calls these once per step (and once per request event) with
timestamps it already took, so an implementation adds no clock reads to the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StepRecord:
    step_id: int
    start: float  # monotonic seconds
    end: float
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    kv_usage: float  # 0..1 after the step
    num_running: int
    num_waiting: int
    preemptions: int  # preempted while planning this step
    request_ids: tuple[str, ...]  # requests served by the step
    # Cumulative prefix-cache counters (KVStats.prefix_queries / prefix_hits, in tokens) after the step.
    prefix_queries: int = 0
    prefix_hits: int = 0
    # (request id, prompt tokens it prefilled in this step) for each request the step prefilled a chunk of.
    prefill_chunks: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class TokenRecord:
    """New tokens of one request in one step."""

    request_id: str
    step_id: int
    time: float  # the step's end
    num_tokens: int
    first: bool  # includes the request's first output token
    batch_size: int  # sequences in the step
    prefill_tokens: int  # prefill tokens that shared the step


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    arrival: float
    finished: float
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    first_scheduled: float | None
    first_token: float | None
    error: str | None = None


class EngineObserver(Protocol):
    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None: ...

    def request_preempted(self, request_id: str, now: float) -> None: ...

    def step_finished(self, step: StepRecord, tokens: list[TokenRecord]) -> None: ...

    def request_finished(self, record: RequestRecord) -> None: ...

    def request_rejected(self, reason: str) -> None: ...


class NullObserver:
    """Telemetry off: every hook does nothing."""

    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None:
        pass

    def request_preempted(self, request_id: str, now: float) -> None:
        pass

    def step_finished(self, step: StepRecord, tokens: list[TokenRecord]) -> None:
        pass

    def request_finished(self, record: RequestRecord) -> None:
        pass

    def request_rejected(self, reason: str) -> None:
        pass
