"""Per-request timing state built from the engine's records, fanned out to sinks (tracing, metrics).

Runs on the telemetry worker thread, never on the engine's. For each request it follows the phases
waiting -> prefill (one or more chunks) -> decode, back to waiting on a preemption, and judges every
inter-token gap (telemetry.itl).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from telemetry.context import RequestContext
from telemetry.interface import RequestRecord, StepRecord, TokenRecord
from telemetry.itl import GapJudge, SlowToken

WAITING, PREFILL, DECODE = "waiting", "prefill", "decode"


@dataclass
class RequestState:
    request_id: str
    queued_at: float  # the engine's clock when the request was queued: its arrival for every latency
    prompt_tokens: int
    params: Any  # the engine's SamplingParams (read by attribute, never imported)
    context: RequestContext
    judge: GapJudge
    phase: str = WAITING
    wait_start: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0  # output tokens so far (all choices)
    first_step_tokens: int = 0  # the tokens of the step that gave it its first (one per choice)
    token_steps: int = 0  # steps that gave it tokens (= tokens with one choice, without speculative decoding)
    chunks: int = 0  # prefill chunks so far (recomputes included)
    preemptions: int = 0
    preempted: bool = False  # since the previous token
    slow: Counter[str] = field(default_factory=Counter)

    @property
    def requeued(self) -> bool:
        return self.preemptions > 0

    @property
    def later_tokens_per_choice(self) -> float:
        """Output tokens after the first step's, per choice: what TPOT divides by (a step verifying guesses
        gives a choice several)."""
        return (self.tokens - self.first_step_tokens) / max(1, getattr(self.params, "n", 1) or 1)


class Sink(Protocol):
    def queued(self, state: RequestState) -> None: ...

    def preempted(self, state: RequestState, now: float) -> None: ...

    def wait_ended(self, state: RequestState, start: float, end: float) -> None: ...

    def prefill_chunk(self, state: RequestState, step: StepRecord, tokens: int) -> None: ...

    def tokens(self, state: RequestState, step: StepRecord, record: TokenRecord, first_index: int, gap: float,
               slow: SlowToken | None) -> None:
        """A request's new tokens in one step: the first has index first_index; gap is the time since its
        previous token (for the first token, since arrival: the TTFT); slow is set when the gap was judged
        slow."""

    def step(self, step: StepRecord, tokens: int) -> None:
        """After the step's requests and tokens: `tokens` new output tokens in all."""

    def finished(self, state: RequestState, record: RequestRecord) -> None: ...

    def rejected(self, reason: str) -> None: ...


class Tracker:
    def __init__(self, sinks: list[Sink], slow_factor: float, slow_min_gaps: int) -> None:
        self.sinks = sinks
        self.slow_factor = slow_factor
        self.slow_min_gaps = slow_min_gaps
        self.requests: dict[str, RequestState] = {}

    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       context: RequestContext) -> None:
        state = RequestState(request_id, now, prompt_tokens, params, context,
                             GapJudge(self.slow_factor, self.slow_min_gaps), wait_start=now)
        self.requests[request_id] = state
        for sink in self.sinks:
            sink.queued(state)

    def request_preempted(self, request_id: str, now: float) -> None:
        state = self.requests.get(request_id)
        if state is None:
            return
        state.phase, state.wait_start, state.preempted = WAITING, now, True
        state.preemptions += 1
        for sink in self.sinks:
            sink.preempted(state, now)

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        chunks = dict(step.prefill_chunks)
        for request_id in step.request_ids:
            state = self.requests.get(request_id)
            if state is not None:
                self._served(state, step, chunks.get(request_id, 0))
        count = 0
        for record in tokens:
            state = self.requests.get(record.request_id)
            if state is not None:
                self._tokens(state, step, record)
                count += record.num_tokens
        for sink in self.sinks:
            sink.step(step, count)

    def request_finished(self, record: RequestRecord) -> None:
        state = self.requests.pop(record.request_id, None)
        if state is None:
            return
        if state.phase == WAITING:  # aborted in the queue: close its wait
            for sink in self.sinks:
                sink.wait_ended(state, state.wait_start, record.finished)
        for sink in self.sinks:
            sink.finished(state, record)

    def request_rejected(self, reason: str) -> None:
        for sink in self.sinks:
            sink.rejected(reason)

    def _served(self, state: RequestState, step: StepRecord, chunk_tokens: int) -> None:
        if state.phase == WAITING:
            if state.first_scheduled is None:
                state.first_scheduled = step.start
            for sink in self.sinks:
                sink.wait_ended(state, state.wait_start, step.start)
            state.phase = PREFILL
        if state.phase == PREFILL:
            state.chunks += 1
            for sink in self.sinks:
                sink.prefill_chunk(state, step, chunk_tokens)

    def _tokens(self, state: RequestState, step: StepRecord, record: TokenRecord) -> None:
        state.phase = DECODE
        last, time = state.last_token, record.time
        if last is None:
            gap, slow = time - state.queued_at, None
            state.first_token, state.first_step_tokens = time, record.num_tokens
        else:
            gap = time - last
            slow = state.judge.judge(gap, max(step.start - last, 0.0), step.end - step.start,
                                     record.prefill_tokens, state.preempted, step.guessed_tokens)
            if slow is not None:
                state.slow[slow.cause] += 1
        first_index = state.tokens
        state.last_token, state.preempted = time, False
        state.tokens += record.num_tokens
        state.token_steps += 1
        for sink in self.sinks:
            sink.tokens(state, step, record, first_index, gap, slow)

    def close_all(self, now: float) -> None:
        """Shutdown: end whatever the engine never finished, as aborted."""
        for state in list(self.requests.values()):
            self.request_finished(RequestRecord(state.request_id, state.queued_at, now, "abort",
                                                state.prompt_tokens, state.tokens, 0, state.first_scheduled,
                                                state.first_token, "telemetry shut down"))
