"""Sampling parameters of one request, validated at construction (invalid values raise InvalidRequestError)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.errors import InvalidRequestError
from scheduler.guided import GuideSpec

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_TEMPERATURE = 2.0  # OpenAI's range


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # a stop string ends the text instead of being cut from it
    guide: GuideSpec | None = None  # constrained decoding: every token follows this grammar

    def __post_init__(self) -> None:
        for check in (self._check_ranges, self._check_counts, self._check_stops):
            check()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def _check_ranges(self) -> None:
        _require(0.0 <= self.temperature <= MAX_TEMPERATURE, f"temperature must be in [0, {MAX_TEMPERATURE:g}]",
                 "temperature")
        _require(0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]", "top_p")
        _require(self.top_k >= -1, "top_k must be -1, 0 (off) or a positive integer", "top_k")
        _require(0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]", "min_p")
        _require(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]", "presence_penalty")
        _require(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]", "frequency_penalty")
        _require(0.0 < self.repetition_penalty <= 10.0, "repetition_penalty must be in (0, 10]",
                 "repetition_penalty")
        _require(self.seed is None or -(2**63) <= self.seed < 2**64, "seed must fit in 64 bits", "seed")

    def _check_counts(self) -> None:
        _require(self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1", "max_tokens")
        _require(self.min_tokens >= 0, "min_tokens must be non-negative", "min_tokens")
        _require(self.max_tokens is None or self.min_tokens <= self.max_tokens,
                 "min_tokens must not exceed max_tokens", "min_tokens")
        _require(1 <= self.n <= MAX_N, f"n must be between 1 and {MAX_N}", "n")
        _require(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
                 f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")

    def _check_stops(self) -> None:
        _require(len(self.stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings", "stop")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty", "stop")
        _require(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                 "stop_token_ids must be non-negative integers", "stop_token_ids")


def _require(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param)
