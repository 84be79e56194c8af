"""One generation stream's state: its tokens, how many have KV computed, and where it stands."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

import numpy as np

from backends.base import LongArray
from scheduler.guided import Guide
from scheduler.params import SamplingParams


class SequenceStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    FORK_PENDING = 2  # a choice of an n > 1 request, forked from choice 0 once its prompt is computed
    # finished states last: `status >= FINISHED_STOPPED` means done
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def finished(self) -> bool:
        return self >= SequenceStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


class RowCounters(Protocol):
    """The running sequences' per-step counters, a row per sequence (scheduler.persistent_batch)."""

    @property
    def computed(self) -> LongArray: ...


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    index: int  # choice index within its request
    prompt_len: int
    token_ids: list[int]  # prompt then output; while it runs, only PersistentBatch.append_tokens adds to it
    params: SamplingParams
    priority: int = 0
    arrival_time: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_cached_tokens: int = 0  # tokens the prefix cache served at its first admission
    num_preemptions: int = 0
    stop_reason: str | int | None = None
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    uniforms_ahead: np.ndarray | None = None  # drawn from rng but not used yet (see UniformsAhead)
    guide: Guide | None = None  # its place in params.guide's grammar (None: unconstrained)
    children: list[Sequence] = field(default_factory=list)  # FORK_PENDING choices forked from this one
    # Its row while it runs, and the arrays that row is in; -1 and None otherwise. Only PersistentBatch sets them.
    row: int = -1
    counters: RowCounters | None = field(default=None, repr=False)

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache, or is being written by the step in flight. Its row counts them while
        it runs; a sequence without a row holds no KV (waiting, preempted, finished)."""
        return 0 if self.counters is None else int(self.counters.computed[self.row])

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def sort_key(self, by_priority: bool) -> tuple[float, ...]:
        """Lower runs first: (priority, arrival) under the priority policy, arrival under FCFS."""
        return (self.priority, self.arrival_time, self.seq_id) if by_priority else (self.arrival_time, self.seq_id)
