"""How much prefill a step may carry while sequences decode: the ITL target's share of the planner.

A step's time is every decoding sequence's gap between two tokens, so with an inter-token-latency target the
planner first prices the decode part of the step (every decoding sequence gets its token: the target bounds
what prefill adds, it never splits a decode batch), then hands what is left of the target to prompt chunks in
the order they would be scheduled, each as many tokens as fit. A chunk that would not fit is not scheduled,
except that the first prompt chunk of a step always gets at least `min_chunk` tokens: with a target too tight
for any prefill, prompts still advance, a minimum chunk per step, so none waits forever.

Where the backend's steps change path above some number of tokens (the cost model's `large` step), a chunk
that would push the step over costs that jump too; the planner then keeps the step under the threshold when
that moves more prompt tokens per second of step time, which it usually does: the NumPy backend's fused step
prefills 48 tokens beside 16 decoding rows at 1.2 ms a token, where 80 would take 2.1 ms a token.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.step_shape import CostCoefficients


@dataclass
class PrefillTime:
    coefficients: CostCoefficients
    limit: float  # seconds the step may take
    spent: float  # predicted seconds of the step so far: its decode part, then each chunk granted
    tokens: int  # tokens in the step so far
    min_chunk: int
    prefill: int = 0  # prompt tokens granted so far
    granted: int = 0  # chunks granted so far

    def chunk(self, need: int, start: int, tokens_left: int) -> int:
        """Tokens for a prompt chunk that needs `need` more tokens from position `start`, with `tokens_left`
        of the step's token budget: the most that fit the time left (0 when none do), but at least the minimum
        chunk for the step's first chunk."""
        most = min(need, tokens_left)
        if most <= 0:
            return 0
        tokens = self._best(need, start, most)
        if self.granted == 0:
            tokens = max(tokens, min(self.min_chunk, most))
        if tokens:
            self.spent += self._extra(tokens, start, tokens == need)
            self.tokens, self.prefill, self.granted = self.tokens + tokens, self.prefill + tokens, self.granted + 1
        return tokens

    def _extra(self, tokens: int, start: int, completes: bool) -> float:
        """Seconds a chunk adds to the step, the jump to the large path included when it crosses there."""
        c = self.coefficients
        crosses = c.is_large(self.tokens + tokens) and not c.is_large(self.tokens)
        return c.chunk_seconds(tokens, start, completes) + (c.large if crosses else 0.0)

    def _best(self, need: int, start: int, most: int) -> int:
        """The largest chunk that fits; or one that keeps the step under the large threshold, when that
        prefills faster."""
        tokens = self._fitting(need, start, most)
        c = self.coefficients
        if not c.is_large(self.tokens + tokens) or c.is_large(self.tokens):
            return tokens
        small = self._fitting(need, start, min(most, c.large_above - self.tokens))
        return small if small and self._rate(small, start, need) >= self._rate(tokens, start, need) else tokens

    def _rate(self, tokens: int, start: int, need: int) -> float:
        """Prompt tokens per second of the step, with this chunk."""
        return (self.prefill + tokens) / (self.spent + self._extra(tokens, start, tokens == need))

    def _fitting(self, need: int, start: int, most: int) -> int:
        """The largest count up to `most` whose chunk fits the time left (a chunk's cost grows with its size)."""
        left = self.limit - self.spent
        if most <= 0 or self._extra(1, start, need == 1) > left:
            return 0
        if self._extra(most, start, most == need) <= left:
            return most
        low, high = 1, most  # low fits, high does not
        while high - low > 1:
            mid = (low + high) // 2
            if self._extra(mid, start, False) <= left:
                low = mid
            else:
                high = mid
        return low
