"""The scheduler package's configuration: batching policy, budgets, queue bounds, the preemption bound and the
inter-token-latency target."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

BATCHING = ("continuous", "static")
SCHEDULING = ("fcfs", "priority")
AUTO: Final = "auto"  # itl_target_ms set step by step from the decode part and the queue (scheduler/itl_target.py)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 512  # tokens in one step (prefill chunks + decode tokens)
    max_model_len: int = 0  # 0: the model's context length
    batching: str = "continuous"
    scheduling: str = "fcfs"
    max_waiting_requests: int = 1024  # admission bound: over it, QueueFullError (503)
    max_waiting_tokens: int = 1_048_576  # prompt tokens waiting, same bound
    # Times a sequence may lose its KV blocks and be recomputed; the next preemption fails its request
    # (503 kv_cache_exhausted) rather than recomputing it again: the cache is too small for the load.
    max_preemptions: int = 8
    # While sequences decode, prefill is cut so that a step's predicted time (scheduler/step_cost.py) stays
    # within this many ms: the stall every decoding stream sees when a prompt is prefilled beside it. 0: off,
    # prefill takes whatever max_num_batched_tokens leaves. "auto": twice the step's decode part times (prompts
    # waiting + sequences decoding) / sequences decoding, at least 100 ms (scheduler/itl_target.py): a slow host
    # is not held to a GPU's target, nor a burst of newcomers to the few streams already decoding.
    itl_target_ms: float | Literal["auto"] = AUTO
    min_prefill_chunk: int = 32  # tokens a step's first prompt chunk always gets, however tight the target
    # After every step, check that the scheduler's rows index exactly its running sequences, their tokens and
    # the KV pool's block tables, and the pool's own invariants (O(blocks + rows) a step); a mismatch fails the
    # engine. Off, the engine checks this only after a step whose results failed to apply part-way.
    debug_checks: bool = False
    # When the backend raises on a step of several requests, the step is re-run in halves of its requests to find
    # the one that made it fail (scheduler/step_retry.py), for at most this many seconds in all; only the
    # requests it cannot clear fail. 0: no re-run, a failed step fails all its requests.
    failed_step_retry_s: float = 10.0

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, not {self.batching!r}")
        if self.scheduling not in SCHEDULING:
            raise ValueError(f"scheduling must be one of {SCHEDULING}, not {self.scheduling!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if self.max_preemptions < 0:
            raise ValueError("max_preemptions must be non-negative")
        if not _valid_itl_target(self.itl_target_ms):
            raise ValueError(f"itl_target_ms must be {AUTO!r}, 0 (off) or a positive number of ms, "
                             f"not {self.itl_target_ms!r}")
        if not self.failed_step_retry_s >= 0:
            raise ValueError(f"failed_step_retry_s must be 0 (off) or positive, not {self.failed_step_retry_s}")
        if self.min_prefill_chunk < 1:
            raise ValueError("min_prefill_chunk must be positive")

    @property
    def targets_itl(self) -> bool:
        """An ITL target is asked for: a number of ms, or derived ("auto"); False when it is off (0)."""
        return self.itl_target_ms != 0


def _valid_itl_target(value: object) -> bool:
    if value == AUTO:
        return True
    # bool is an int, and True ms is no target anyone means; nan and inf bound nothing
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


SPECULATIVE_METHODS = ("off", "ngram", "draft")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (scheduler/speculation.py): a decoding sequence's next tokens are guessed, and one
    step computes the guesses' logits beside its own token, keeping the longest run the model agrees with."""

    # off; ngram: prompt lookup, the tokens that followed the sequence's last n tokens where they last occurred
    # in it (1 <= n <= ngram_max), found without another model; draft: a smaller model's greedy tokens
    # (scheduler/draft.py), the model at draft_model
    speculative_method: str = "off"
    # the most tokens guessed per sequence and step (k); fewer where the step-cost model says a guess is not
    # worth its row (scheduler/speculation.py). 3: a CPU's stored-weight kernels verify up to 4 rows for about
    # 1.6x one row's time, 5 for 2.9x (PERFORMANCE.md, "Speculative decoding")
    num_speculative_tokens: int = 3
    ngram_max: int = 4  # the longest n-gram matched; longer matches are tried first
    draft_model: str | None = None  # the draft method's model (a GGUF file or a checkpoint directory)

    def __post_init__(self) -> None:
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method must be one of {SPECULATIVE_METHODS}, "
                             f"not {self.speculative_method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], not {self.num_speculative_tokens}")
        if not 1 <= self.ngram_max <= 16:
            raise ValueError(f"ngram_max must be in [1, 16], not {self.ngram_max}")
        if (self.speculative_method == "draft") != (self.draft_model is not None):
            raise ValueError("speculative_method draft takes its model from draft_model, and only it does: set "
                             "both or neither")

    @property
    def enabled(self) -> bool:
        return self.speculative_method != "off"
