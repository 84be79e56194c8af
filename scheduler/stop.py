"""Stop conditions: token-level (EOS, stop token ids, max_tokens, context length) and stop strings."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from scheduler.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class TokenStop:
    status: SequenceStatus
    stop_reason: int | None = None


def check_token_stop(seq: Sequence, eos_ids: frozenset[int], max_model_len: int) -> TokenStop | None:
    """Whether the token just appended to `seq` ends it."""
    last, params, produced = seq.token_ids[-1], seq.params, seq.num_output_tokens
    if produced >= params.min_tokens:
        if last in eos_ids and not params.ignore_eos:
            return TokenStop(SequenceStatus.FINISHED_STOPPED)
        if last in params.stop_token_ids:
            return TokenStop(SequenceStatus.FINISHED_STOPPED, last)
    if params.max_tokens is not None and produced >= params.max_tokens:
        return TokenStop(SequenceStatus.FINISHED_LENGTH)
    if seq.num_tokens >= max_model_len:
        return TokenStop(SequenceStatus.FINISHED_LENGTH)
    return None


class Detokenizer(Protocol):
    def push(self, ids: Seq[int]) -> str: ...

    def flush(self) -> str: ...


class TextAssembler:
    """Turns a sequence's new tokens into text deltas, cutting the output before any stop string.

    The last (longest stop string - 1) characters are held back until they cannot begin a stop string, so a
    stop string split across tokens is still found and never partly emitted.
    """

    def __init__(self, detokenizer: Detokenizer, stop: Seq[str]) -> None:
        self._detok = detokenizer
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._held = ""

    def push(self, ids: Seq[int]) -> tuple[str, str | None]:
        """(text to emit, the stop string found or None). After a stop, nothing more is emitted."""
        if not self._stop:
            return self._detok.push(ids), None
        buffer = self._held + self._detok.push(ids)
        hit = self._first_stop(buffer)
        if hit is not None:
            position, stop = hit
            self._held = ""
            return buffer[:position], stop
        cut = max(0, len(buffer) - self._hold)
        self._held = buffer[cut:]
        return buffer[:cut], None

    def finish(self) -> str:
        """Everything still held back, when the sequence ends for another reason."""
        rest, self._held = self._held + self._detok.flush(), ""
        return rest

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        found = [(text.find(s), s) for s in self._stop]
        hits = [(pos, s) for pos, s in found if pos >= 0]
        return min(hits) if hits else None
