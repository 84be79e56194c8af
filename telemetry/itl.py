"""Inter-token latency attribution: why was this token late?

Each gap between a request's consecutive tokens splits into the wait before the step that produced the token
started (previous token -> step start) and the step's own duration. A gap over `factor` x the request's running
median gap is a slow token, and its cause is, in order:

- "preemption": the request was preempted since its previous token (its KV was dropped, it waited in the queue
  and its context was recomputed);
- "queue": the wait before the step dominates: the request sat out one or more steps (token budget spent on
  others, no free KV to place it) or the engine stalled between steps;
- "prefill_interference": the step was shared with N prefill tokens of other requests' prompts;
- "speculation": the step verified N guessed tokens (speculative decoding), its own or other requests';
- "slow_step": none of the above: the step itself was slow (a large batch, the host, the device).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

CAUSES = ("preemption", "queue", "prefill_interference", "speculation", "slow_step")


@dataclass(frozen=True)
class TokenGap:
    """One new-token step of a request, as the attribution sees it."""

    gap: float  # seconds since the request's previous token
    wait: float  # previous token -> start of this token's step
    step_duration: float
    prefill_tokens: int  # prefill tokens that shared the step
    preempted: bool  # preempted since the previous token
    guessed_tokens: int = 0  # guessed tokens the step verified (speculative decoding)


@dataclass(frozen=True)
class SlowToken:
    cause: str
    gap: float
    median: float
    threshold: float
    wait: float
    step_duration: float
    prefill_tokens: int


def classify(gap: TokenGap) -> str:
    if gap.preempted:
        return "preemption"
    if gap.wait > gap.step_duration:
        return "queue"
    if gap.prefill_tokens > 0:
        return "prefill_interference"
    if gap.guessed_tokens > 0:
        return "speculation"
    return "slow_step"


class RunningMedian:
    """Median of a growing sample in O(log n) per value: a max-heap of the low half, a min-heap of the high.
    `value` is kept up to date by `add`, so reading it costs nothing."""

    def __init__(self) -> None:
        self._low: list[float] = []  # negated
        self._high: list[float] = []
        self.count = 0
        self.value = 0.0

    def __len__(self) -> int:
        return self.count

    def add(self, value: float) -> None:
        low, high = self._low, self._high
        if low and value > -low[0]:
            heapq.heappush(high, value)
        else:
            heapq.heappush(low, -value)
        self.count += 1
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        self.value = -low[0] if self.count % 2 else (high[0] - low[0]) / 2


class GapJudge:
    """One request's gaps: judges each against the median of the gaps before it, then adds it."""

    def __init__(self, factor: float, min_gaps: int) -> None:
        self.factor = factor
        self.min_gaps = min_gaps
        self.median = RunningMedian()

    def judge(self, gap: float, wait: float, step_duration: float, prefill_tokens: int, preempted: bool,
              guessed_tokens: int = 0) -> SlowToken | None:
        """Plain arguments: this runs once per token, so it builds nothing unless the token is slow."""
        running = self.median
        median = running.value
        slow = running.count >= self.min_gaps and median > 0 and gap > self.factor * median
        running.add(gap)
        if not slow:
            return None
        cause = classify(TokenGap(gap, wait, step_duration, prefill_tokens, preempted, guessed_tokens))
        return SlowToken(cause, gap, median, self.factor * median, wait, step_duration, prefill_tokens)
