"""Speculative decoding's counters over a run: the server's /metrics before and after, read for the
spec_decode_* counters (pagedserve's and vLLM's names: `<prefix>spec_decode_num_draft_tokens` or
`<prefix>spec_decode_draft_tokens`, and the accepted ones). None when the server exports none."""

from __future__ import annotations

from dataclasses import dataclass

from bench.loadgen.promtext import gauge_values

GUESSED = ("spec_decode_draft_tokens_total", "spec_decode_num_draft_tokens_total")
KEPT = ("spec_decode_accepted_tokens_total", "spec_decode_num_accepted_tokens_total")


@dataclass(frozen=True)
class Speculation:
    guessed: float  # tokens proposed and verified during the run
    kept: float  # of them, accepted

    @property
    def acceptance(self) -> float:
        return self.kept / self.guessed if self.guessed else 0.0


def speculation_between(before: str, after: str) -> Speculation | None:
    if not before or not after:  # a failed scrape: the server's lifetime totals are no run's
        return None
    start, end = gauge_values(before), gauge_values(after)
    guessed, kept = _delta(start, end, GUESSED), _delta(start, end, KEPT)
    return None if guessed is None or kept is None else Speculation(guessed, kept)


def _delta(start: dict[str, float], end: dict[str, float], suffixes: tuple[str, ...]) -> float | None:
    names = [name for name in end if name.endswith(suffixes)]
    if not names:
        return None
    return sum(end[name] - start.get(name, 0.0) for name in names)


def format_speculation(s: Speculation) -> str:
    return (f"{'Speculative decoding:':<38}{s.kept:,.0f} of {s.guessed:,.0f} guessed tokens kept "
            f"(acceptance {s.acceptance:.1%})")
