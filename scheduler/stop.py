"""Stop conditions: token-level (EOS, stop token ids, max_tokens, context length) and stop strings."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from backends.base import LongArray
from scheduler.block_table import Index, grown
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


@dataclass
class StopColumns:
    """Per row: the token count at which a length stop is due, and the token ids that can end the sequence
    (EOS unless ignore_eos, and stop_token_ids; -1 pads). A step finds in NumPy the few sampled rows that may
    have stopped, and check_token_stop decides those exactly (min_tokens included)."""

    eos_ids: frozenset[int]
    max_model_len: int
    limit: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))
    ids: LongArray = field(default_factory=lambda: np.full((8, 1), -1, np.int64))

    def set_row(self, row: int, seq: Sequence) -> None:
        params = seq.params
        ids = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids))
        if row >= len(self.limit) or len(ids) > self.ids.shape[1]:
            self.limit = grown(self.limit, row + 1)
            self.ids = _padded_grow(self.ids, row + 1, len(ids))
        length = seq.prompt_len + params.max_tokens if params.max_tokens is not None else self.max_model_len
        self.limit[row] = min(length, self.max_model_len)
        self.ids[row] = -1
        self.ids[row, : len(ids)] = ids

    def candidates(self, rows: Index, tokens: LongArray, num_tokens: LongArray) -> np.ndarray:
        """Which sampled sequences may have stopped: rows[i] got tokens[i] and now has num_tokens[i] tokens."""
        return (num_tokens >= self.limit[rows]) | (self.ids[rows] == tokens[:, None]).any(axis=1)


def _padded_grow(ids: LongArray, rows: int, cols: int) -> LongArray:
    grown_ids = grown(ids, rows, cols)
    if grown_ids is not ids:  # new cells are padding
        grown_ids[ids.shape[0] :] = -1
        grown_ids[:, ids.shape[1] :] = -1
    return grown_ids


class Detokenizer(Protocol):
    def push(self, ids: Seq[int]) -> str: ...

    def push_token(self, token_id: int) -> str:
        """push((token_id,)): the one-token case of every decode step, which an implementation can make cheap."""
        ...

    def flush(self) -> str: ...


class TextAssembler:
    """Turns a sequence's new tokens into text deltas, cutting the output before any stop string.

    The last (longest stop string - 1) characters are held back until they cannot begin a stop string, so a
    stop string split across tokens is still found and never partly emitted.
    """

    def __init__(self, detokenizer: Detokenizer, stop: Seq[str], include_stop: bool = False) -> None:
        self._detok = detokenizer
        self._stop = tuple(stop)
        self._include_stop = include_stop
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._held = ""
        # With no stop strings nothing is held back: a token's text is the detokenizer's, one call per token.
        self.text_of: Callable[[int], str] | None = None if self._stop else detokenizer.push_token

    def push(self, ids: Seq[int]) -> tuple[str, str | None]:
        """(text to emit, the stop string found or None). After a stop, nothing more is emitted; the text ends
        just before the stop string, or just after it when the request asked to include it."""
        if not self._stop:
            return self._detok.push(ids), None
        buffer = self._held + self._detok.push(ids)
        hit = self._first_stop(buffer)
        if hit is not None:
            position, stop = hit
            self._held = ""
            end = position + len(stop) if self._include_stop else position
            return buffer[:end], stop
        cut = max(0, len(buffer) - self._hold)
        self._held = buffer[cut:]
        return buffer[:cut], None

    def push_token(self, token_id: int) -> tuple[str, str | None]:
        """push([token_id]), without the list when there are no stop strings to look for."""
        if not self._stop:
            return self._detok.push_token(token_id), None
        return self.push((token_id,))

    def finish(self) -> str:
        """Everything still held back, when the sequence ends for another reason."""
        rest, self._held = self._held + self._detok.flush(), ""
        return rest

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        return first_stop(text, self._stop)


def first_stop(text: str, stop: Seq[str]) -> tuple[int, str] | None:
    """Where the earliest stop string starts in text, and which (None: none occurs)."""
    hits = [(pos, s) for s in stop if (pos := text.find(s)) >= 0]
    return min(hits) if hits else None


def cut_at_stop(text: str, stop: Seq[str], include_stop: bool = False) -> str:
    """A whole output's text as TextAssembler emits it: ended before its first stop string (after, if included)."""
    hit = first_stop(text, stop)
    if hit is None:
        return text
    position, found = hit
    return text[: position + len(found) if include_stop else position]
