"""Speculative decoding's proposals: guessed next tokens for decoding sequences, and how many each may guess.

A step computes a sequence's own next token beside k guessed ones (a row of k + 1 query positions), samples
every position, and keeps the guesses up to the first one the model's own sample disagrees with, plus that
sample (scheduler/verify.py). The model samples each position exactly as it would without the guesses (the
same logits, the sequence's next uniform), so the output is the same token for token, greedy or seeded: for
a proposal that is one token (a point mass, as prompt lookup's is), keeping a guess when the model's sample
equals it is rejection sampling's rule (accept with probability p(guess), else draw from the rest of p).

Proposals come from prompt lookup (`ngram`): the tokens that followed the sequence's last n tokens where
those n tokens last occurred earlier in it, longest n first. Each sequence's k adapts to how its guesses
fare: it grows while they are all kept, falls to what was kept plus one otherwise, and after guesses keep
failing the sequence stops guessing for a while (a backoff that doubles), so a stream that never repeats
itself pays for a guess only now and then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.config import SpeculativeConfig

MISSES_BEFORE_PAUSE = 2  # steps in a row with no guess kept before a sequence pauses its guessing
MAX_PAUSE = 64  # the longest pause, in steps


@dataclass
class NgramIndex:
    """Where each n-gram (1 <= n <= ngram_max) of a sequence's tokens last ended, left of its last token."""

    ngram_max: int
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in the map

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest suffix of `tokens` seen before; [] when none was."""
        self._catch_up(tokens)
        for n in range(min(self.ngram_max, len(tokens) - 1), 0, -1):
            end = self.last_end.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []

    def _catch_up(self, tokens: list[int]) -> None:
        last_end, most = self.last_end, self.ngram_max
        for end in range(self.indexed, len(tokens) - 1):  # the suffix itself is not a match of itself
            for n in range(1, min(most, end + 1) + 1):
                last_end[tuple(tokens[end + 1 - n : end + 1])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)


@dataclass
class Guessing:
    """One sequence's proposer state and how many tokens it guesses next."""

    index: NgramIndex
    k: int
    misses: int = 0  # steps in a row whose guesses were all rejected
    pause: int = 0  # the length of the next pause
    paused_until: int = 0  # the step from which it guesses again

    def observe(self, proposed: int, accepted: int, step: int, most: int) -> None:
        if accepted == proposed:
            self.k, self.misses, self.pause = min(most, self.k + 1), 0, 0
            return
        self.k = max(1, accepted + 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= MISSES_BEFORE_PAUSE:
            self.pause = min(MAX_PAUSE, 2 * self.pause or 1)
            self.paused_until, self.misses = step + self.pause, 0


@dataclass
class SpecCounters:
    """Totals since start: for /metrics and the benchmarks' acceptance rate."""

    method: str
    steps: int = 0  # (sequence, step) pairs that verified at least one guess
    proposed: int = 0
    accepted: int = 0


class Speculator:
    """Proposals for the scheduler; it calls `propose()` when it plans a step and `observe()` when the step's
    tokens are verified, and `forget()` when a sequence ends."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.counters = SpecCounters(config.speculative_method)
        self._states: dict[int, Guessing] = {}
        self._step = 0

    def propose(self, seq_id: int, tokens: list[int], most: int) -> list[int]:
        """At most `most` guesses of the tokens after `tokens` (the sequence's, its last one not yet computed)."""
        state = self._states.get(seq_id)
        if state is None:
            state = self._states[seq_id] = Guessing(NgramIndex(self.config.ngram_max),
                                                    self.config.num_speculative_tokens)
        if self._step < state.paused_until:
            return []
        return state.index.propose(tokens, min(most, state.k))

    def observe(self, seq_id: int, proposed: int, accepted: int) -> None:
        counters = self.counters
        counters.steps, counters.proposed, counters.accepted = (counters.steps + 1, counters.proposed + proposed,
                                                                counters.accepted + accepted)
        state = self._states.get(seq_id)
        if state is not None:
            state.observe(proposed, accepted, self._step, self.config.num_speculative_tokens)

    def next_step(self) -> None:
        self._step += 1

    def forget(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)
