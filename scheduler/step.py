"""What one step is to the scheduler: the plan it decided, which carries the backend's StepBatch, and the
updates the backend's StepOutput made to the sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from backends.base import IntArray, LongArray, StepBatch, StepOutput
from backends.step_shape import StepShape
from scheduler.batch_builder import Verify
from scheduler.outputs import TokenLogprob
from scheduler.sequence import Sequence


def _none() -> np.ndarray:
    return np.zeros(0, np.int32)


@dataclass(frozen=True)
class SchedulerPlan:
    step_id: int
    batch: StepBatch | None  # None when nothing could be scheduled
    seqs: list[Sequence] = field(default_factory=list)  # scheduled, in batch order
    rows: LongArray = field(default_factory=lambda: np.zeros(0, np.int64))  # each one's persistent row
    starts: IntArray = field(default_factory=_none)  # first position each computes
    counts: IntArray = field(default_factory=_none)  # tokens each computes this step
    sampled: list[Sequence] = field(default_factory=list)  # one per entry of batch.sample_rows
    forks: list[Sequence] = field(default_factory=list)  # parents whose pending choices fork with this step
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)  # preempted once too often: ended, their requests fail
    admitted: list[Sequence] = field(default_factory=list)  # taken from the waiting queue this step
    prefill: tuple[int, ...] = ()  # indices into seqs of prompt chunks or recomputes (not one decode token)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    shape: StepShape | None = None  # what the step does, for the cost model (None without one)
    predicted_s: float = 0.0  # the cost model's prediction of its time when planned
    version: int = 0  # the persistent rows' version when planned: unchanged at update means nothing was aborted
    verify: Verify | None = None  # where the sampled guesses are, when the step verifies guesses

    @property
    def guessed_tokens(self) -> int:
        """Speculative decoding's guesses among the step's decode tokens."""
        return 0 if self.verify is None else int(self.verify.counts.sum())

    @property
    def mixed(self) -> bool:
        """Prompt tokens beside decode tokens: the steps whose size an ITL target decides."""
        return self.prefill_tokens > 0 and self.decode_tokens > 0


@dataclass(frozen=True)
class StepUpdates:
    """A step's new tokens as columns: one per sampled sequence still running when the step ended."""

    seqs: list[Sequence]
    token_ids: list[int]
    finished: frozenset[int] = frozenset()  # positions of the sequences a token-level stop ended
    logprobs: list[TokenLogprob | None] | None = None  # per position, when the step returned logprobs
    broken_guides: dict[str, str] = field(default_factory=dict)  # request id -> why its grammar failed


def joined(parts: list[StepUpdates]) -> StepUpdates:
    """One step's updates made in rounds (a step verifying guesses), in order: a sequence appears once per
    token it got."""
    if len(parts) == 1:
        return parts[0]
    seqs: list[Sequence] = []
    tokens: list[int] = []
    finished: set[int] = set()
    logprobs: list[TokenLogprob | None] = []
    broken: dict[str, str] = {}
    for part in parts:
        finished.update(len(seqs) + i for i in part.finished)
        seqs += part.seqs
        tokens += part.token_ids
        logprobs += part.logprobs or [None] * len(part.seqs)
        broken.update(part.broken_guides)
    wanted = any(part.logprobs is not None for part in parts)
    return StepUpdates(seqs, tokens, frozenset(finished), logprobs if wanted else None, broken)


def token_logprobs(output: StepOutput, seqs: list[Sequence], tokens: list[int], index: list[int] | None
                   ) -> list[TokenLogprob | None] | None:
    """Each new token's logprob, for the sequences that asked; `index`: their rows of the output (None: all)."""
    if output.logprobs is None:
        return None
    rows = index if index is not None else range(len(seqs))
    return [_logprob(output, row, seq, token) for row, seq, token in zip(rows, seqs, tokens, strict=True)]


def _logprob(output: StepOutput, row: int, seq: Sequence, token: int) -> TokenLogprob | None:
    if not (seq.params.logprobs or seq.params.top_logprobs) or output.logprobs is None:
        return None
    top: tuple[tuple[int, float], ...] = ()
    if seq.params.top_logprobs and output.top_token_ids is not None and output.top_logprobs is not None:
        ids, values = output.top_token_ids[row], output.top_logprobs[row]
        top = tuple((int(i), float(v)) for i, v in list(zip(ids, values, strict=True))[: seq.params.top_logprobs])
    return TokenLogprob(token, float(output.logprobs[row]), top)
