"""The thin interface through which the engine reports what happens; telemetry implements it.

Plain data in, nothing returned: the engine calls these once per step (and once per request event) with
timestamps it already took, so an implementation adds no clock reads to the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload


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
    # The step-cost model: the step's time from planning to its tokens out, what the model predicted when it
    # was planned (0: no prediction), and the model's coefficients by name (seconds per unit) and headroom.
    seconds: float = 0.0
    predicted_s: float = 0.0
    cost_coefficients: tuple[tuple[str, float], ...] = ()
    cost_headroom: float = 1.0
    guessed_tokens: int = 0  # speculative decoding's guesses the step verified (counted in decode_tokens)


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


class StepTokens(Sequence[TokenRecord]):
    """A step's TokenRecords, one per request that got tokens, each made when it is read.

    The engine hands over columns it has anyway; whoever reads the records (the telemetry worker thread)
    builds them, so a step with hundreds of requests builds no record on the engine's thread.
    """

    __slots__ = ("_batch_size", "_counts", "_firsts", "_prefill_tokens", "_request_ids", "_step_id", "_time")

    def __init__(self, step_id: int, time: float, batch_size: int, prefill_tokens: int, request_ids: list[str],
                 counts: list[int], firsts: frozenset[str]) -> None:
        self._step_id, self._time, self._batch_size, self._prefill_tokens = step_id, time, batch_size, prefill_tokens
        self._request_ids, self._counts, self._firsts = request_ids, counts, firsts  # firsts: got their first

    def __len__(self) -> int:
        return len(self._request_ids)

    @overload
    def __getitem__(self, index: int) -> TokenRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[TokenRecord]: ...

    def __getitem__(self, index: int | slice) -> TokenRecord | list[TokenRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        request_id = self._request_ids[index]
        return TokenRecord(request_id, self._step_id, self._time, self._counts[index], request_id in self._firsts,
                           self._batch_size, self._prefill_tokens)


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
    # Each choice's prompt-then-output token ids: the engine's own lists, handed over uncopied (a tuple of
    # references per request); read on the telemetry thread only when content is recorded, for the completion.
    token_ids: tuple[Sequence[int], ...] = ()


class EngineObserver(Protocol):
    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None: ...

    def request_preempted(self, request_id: str, now: float) -> None: ...

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None: ...

    def request_finished(self, record: RequestRecord) -> None: ...

    def request_rejected(self, reason: str) -> None: ...

    def step_failed(self, cause: str) -> None:
        """An engine step failed (cause: one of STEP_FAILURE_CAUSES); its requests were failed."""
        ...

    def itl_target(self, seconds: float) -> None:
        """The inter-token-latency target the scheduler holds steps to (0: off): as the engine is built, and
        again whenever "auto" sets a new limit for a step that prefills beside decodes."""
        ...


STEP_FAILURE_CAUSES = ("backend_error", "bad_output", "output_processing", "hang", "crash")


class NullObserver:
    """Telemetry off: every hook does nothing."""

    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None:
        pass

    def request_preempted(self, request_id: str, now: float) -> None:
        pass

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        pass

    def request_finished(self, record: RequestRecord) -> None:
        pass

    def request_rejected(self, reason: str) -> None:
        pass

    def step_failed(self, cause: str) -> None:
        pass

    def itl_target(self, seconds: float) -> None:
        pass


def observes_steps(observer: object) -> bool:
    """False when the observer's step_finished is NullObserver's, which does nothing: the engine then skips
    building the step's records."""
    return getattr(type(observer), "step_finished", None) is not NullObserver.step_finished
