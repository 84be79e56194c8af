"""Speculative decoding's proposals: guessed next tokens for decoding sequences, and how many each may guess.

A step computes a sequence's own next token beside k guessed ones (a row of k + 1 query positions), samples
every position, and keeps the guesses up to the first one the model's own sample disagrees with, plus that
sample (scheduler/verify.py). The model samples each position exactly as it would without the guesses (the
same logits, the sequence's next uniform), so the output is the same token for token, greedy or seeded: for
a proposal that is one token (a point mass, as prompt lookup's is), keeping a guess when the model's sample
equals it is rejection sampling's rule (accept with probability p(guess), else draw from the rest of p).

Proposals come from prompt lookup (`ngram`): the tokens that followed the sequence's last n tokens where
those n tokens last occurred earlier in it, longest n first; or from a draft model (`draft`,
scheduler/draft.py), a smaller model's greedy tokens, also a point mass. How many a sequence guesses (at most
num_speculative_tokens) weighs what a guess costs against what it is worth: the scheduler's step-cost model
prices one more row beside the step's decode part, a kept token is worth the time per token of that part
(its time over its sequences), and the j-th guess is kept with probability rate^j, the sequence's own
rate of guesses kept. So a lone stream on a CPU, whose step is bound by reading the weights, guesses freely,
while a large batch, whose rows cost nearly what a step per token does, guesses only where its guesses
are nearly always right. After guesses keep failing, a sequence stops guessing for a while (a backoff that
doubles), so a stream that never repeats itself pays for a guess only now and then; a sequence whose rate is
below the price still makes one guess when not paused (a probe), or one early miss would silence it for good.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.config import SpeculativeConfig

MISSES_BEFORE_PAUSE = 2  # steps in a row with no guess kept before a sequence pauses its guessing
MAX_PAUSE = 64  # the longest pause, in steps
PROBE_BELOW = 0.5  # a guess's price (in kept-token's worth) under which a sequence not worth guessing probes
PRIOR_WEIGHT = 2.0  # guesses' worth of evidence a new sequence starts with, at the engine's recent rate
DECAY = 0.8  # of a sequence's counts at each verification: its last few steps decide
ENGINE_DECAY = 0.99  # of the engine's counts at each verification: its last few hundred decide


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


@dataclass(kw_only=True)
class KeptRate:
    """How often guesses are kept: decayed counts of the guesses kept and of those judged (the ones after a
    run's first rejected guess never are)."""

    kept: float = PRIOR_WEIGHT / 2
    tried: float = PRIOR_WEIGHT

    @property
    def rate(self) -> float:
        return self.kept / self.tried

    def add(self, proposed: int, accepted: int, decay: float) -> None:
        self.kept = decay * self.kept + accepted
        self.tried = decay * self.tried + accepted + (accepted < proposed)


@dataclass
class Guessing(KeptRate):
    """One sequence's proposer state and how its guesses fare: each guess is kept with the probability `rate`,
    the first rejected one ending the run. A new sequence starts from the engine's recent rate: a workload that
    repeats its prompts guesses fully from its first steps."""

    index: NgramIndex
    misses: int = 0  # steps in a row whose guesses were all rejected
    pause: int = 0  # the length of the next pause
    paused_until: int = 0  # the step from which it guesses again

    def worth(self, threshold: float, most: int) -> int:
        """Guesses worth making: the j-th is kept with probability rate^j, and is worth its cost while that is
        at least `threshold` (a guess's cost over a kept token's worth)."""
        rate = self.rate
        if threshold <= 0 or rate >= 1:
            return most
        if rate <= 0 or threshold >= 1:
            return 0
        return min(most, int(math.log(threshold) / math.log(rate)))

    def observe(self, proposed: int, accepted: int, step: int) -> None:
        self.add(proposed, accepted, DECAY)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if accepted:
            self.pause = 0
        elif self.misses >= MISSES_BEFORE_PAUSE:
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

    def __init__(self, config: SpeculativeConfig, forget_draft: Callable[[int], None] | None = None) -> None:
        """forget_draft: told of each sequence that ends, with the draft method (the draft's pool frees it)."""
        self.config = config
        self.counters = SpecCounters(config.speculative_method)
        self._states: dict[int, Guessing] = {}
        self._step = 0
        self._recent = KeptRate()  # every sequence's verifications, decayed: a new one's prior
        self._drafted: dict[int, list[int]] = {}  # the draft model's guesses for the step being planned
        self._forget_draft = forget_draft

    @property
    def drafts(self) -> bool:
        """Guesses come from a draft model, run before the step is planned (scheduler/draft.py)."""
        return self.config.speculative_method == "draft"

    def propose(self, seq_id: int, tokens: list[int], most: int, threshold: float = 0.0) -> list[int]:
        """At most `most` guesses of the tokens after `tokens` (the sequence's, its last one not yet computed),
        as many as are worth `threshold` (Guessing.worth); with a draft model, what it guessed (`take_drafts`)."""
        if self.drafts:
            return self._drafted.get(seq_id, [])[:most]
        k = self.wanted(seq_id, most, threshold)
        return self._states[seq_id].index.propose(tokens, k) if k else []

    def wanted(self, seq_id: int, most: int, threshold: float = 0.0) -> int:
        """How many guesses the sequence makes this step (0 while it pauses), at most `most`."""
        state = self._states.get(seq_id)
        if state is None:
            state = self._states[seq_id] = Guessing(NgramIndex(self.config.ngram_max),
                                                    kept=self._recent.rate * PRIOR_WEIGHT)
        if self._step < state.paused_until:
            return 0
        k = state.worth(threshold, min(most, self.config.num_speculative_tokens))
        # Not worth a guess at its rate, where a guess costs less than half a token's worth: one guess anyway (a
        # probe), since a sequence that never guesses never learns that its text began to repeat; failed probes
        # pause it as failed guesses do, for ever longer. A crowded step (a guess nearly a token's price) never
        # probes.
        return 1 if k == 0 and threshold < PROBE_BELOW else k

    def take_drafts(self, drafted: dict[int, list[int]]) -> None:
        """The draft model's guesses for the next step planned (replacing the last step's)."""
        self._drafted = drafted

    def observe(self, seq_id: int, proposed: int, accepted: int) -> None:
        counters = self.counters
        counters.steps, counters.proposed, counters.accepted = (counters.steps + 1, counters.proposed + proposed,
                                                                counters.accepted + accepted)
        state = self._states.get(seq_id)
        if state is not None:
            state.observe(proposed, accepted, self._step)
        self._recent.add(proposed, accepted, ENGINE_DECAY)

    def next_step(self) -> None:
        self._step += 1

    def forget(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)
        if self._forget_draft is not None:
            self._forget_draft(seq_id)
