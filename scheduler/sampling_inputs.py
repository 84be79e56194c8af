"""Per-row sampling arrays for a step, with each request's own generator drawing its uniforms.

Each running sequence's parameters sit in one row of per-parameter arrays, written when it gets its row, so a
step's SamplingInputs are NumPy gathers over the sampled rows, reused as long as the same rows are sampled.
Only what changes per step is built per step: the uniforms, and the penalty and min_tokens inputs when a
sampled request uses them.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from backends.base import FloatArray, IntArray, LongArray, SamplingInputs
from scheduler.block_table import Index, grown
from scheduler.guided import PendingMasks
from scheduler.sequence import Sequence

AHEAD = 64  # uniforms drawn ahead per sequence: a generator call per sequence every AHEAD steps
BoolArray = npt.NDArray[np.bool_]
_COLUMNS = ("temperature", "top_k", "top_p", "min_p", "random", "penalties", "min_tokens", "logprobs",
            "top_logprobs", "guided")


@dataclass
class UniformsAhead:
    """Each non-greedy running sequence's next uniforms, drawn AHEAD at a time from its own generator, so a
    step takes them all with one gather instead of a generator call per sequence.

    A sequence leaving its row takes its unused draws along (Sequence.uniforms_ahead), so its i-th uniform is
    its generator's i-th draw however it was batched or preempted: seeded requests stay reproducible.
    """

    values: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((8, AHEAD)))
    used: LongArray = field(default_factory=lambda: np.zeros(8, np.int64))

    def fill(self, row: int, seq: Sequence) -> None:
        if row >= len(self.used):
            self.values, self.used = grown(self.values, row + 1), grown(self.used, row + 1)
        spare = seq.uniforms_ahead if seq.uniforms_ahead is not None else np.zeros(0)
        self.values[row, : len(spare)] = spare
        self.values[row, len(spare) :] = seq.rng.random(AHEAD - len(spare))
        self.used[row] = 0
        seq.uniforms_ahead = None

    def release(self, row: int, seq: Sequence) -> None:
        seq.uniforms_ahead = self.values[row, self.used[row] :].copy()

    def draw(self, rows: Index, seqs: Seq[Sequence | None]) -> npt.NDArray[np.float64]:
        """The next uniform of each row; a row repeated (a sequence verifying guesses: one per position, in a
        run) takes its next ones in turn. Rows that used their last one are refilled."""
        if len(rows) > 1 and not (rows[1:] != rows[:-1]).all():
            return self._draw_runs(rows, seqs)
        used = self.used[rows]
        out = self.values[rows, used]
        used += 1
        self.used[rows] = used
        for row in rows[used == AHEAD].tolist():
            seq = seqs[row]
            assert seq is not None
            self.fill(row, seq)
        return out


    def _draw_runs(self, rows: Index, seqs: Seq[Sequence | None]) -> npt.NDArray[np.float64]:
        out = np.zeros(len(rows))
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(rows)], strict=True):
            row, count = int(rows[start]), end - start
            if self.used[row] + count >= AHEAD:  # keep what give_back() may return within the draws held
                seq = seqs[row]
                assert seq is not None
                self.release(row, seq)
                self.fill(row, seq)
            used = int(self.used[row])
            out[start:end] = self.values[row, used : used + count]
            self.used[row] = used + count
        return out

    def give_back(self, row: int, count: int) -> None:
        """The row's last `count` draws went unused (guesses rejected): its next draws are those again."""
        self.used[row] -= count


@dataclass(frozen=True)
class _Gathered:
    """The part of a step's SamplingInputs fixed by which rows it samples."""

    temperature: FloatArray
    top_k: IntArray
    top_p: FloatArray
    min_p: FloatArray
    random_at: Index  # positions whose uniform comes from their row's draws ahead
    random_rows: Index  # their rows
    penalties: bool
    min_tokens: bool
    num_top_logprobs: int
    want_logprobs: bool
    guided_at: Index  # positions whose sequence follows a grammar


@dataclass
class SamplingColumns:
    """Row r holds the sampling parameters of the sequence in row r."""

    temperature: FloatArray = field(default_factory=lambda: np.zeros(8, np.float32))
    top_k: IntArray = field(default_factory=lambda: np.zeros(8, np.int32))
    top_p: FloatArray = field(default_factory=lambda: np.zeros(8, np.float32))
    min_p: FloatArray = field(default_factory=lambda: np.zeros(8, np.float32))
    random: BoolArray = field(default_factory=lambda: np.zeros(8, np.bool_))  # not greedy: a uniform per step
    penalties: BoolArray = field(default_factory=lambda: np.zeros(8, np.bool_))
    min_tokens: BoolArray = field(default_factory=lambda: np.zeros(8, np.bool_))
    logprobs: BoolArray = field(default_factory=lambda: np.zeros(8, np.bool_))
    top_logprobs: IntArray = field(default_factory=lambda: np.zeros(8, np.int32))
    guided: BoolArray = field(default_factory=lambda: np.zeros(8, np.bool_))
    ahead: UniformsAhead = field(default_factory=UniformsAhead)
    _last: tuple[tuple[int, bytes], _Gathered] | None = None

    def set_row(self, row: int, seq: Sequence) -> None:
        if row >= len(self.temperature):
            for name in _COLUMNS:
                setattr(self, name, grown(getattr(self, name), row + 1))
        p = seq.params
        self.temperature[row], self.top_k[row], self.top_p[row], self.min_p[row] = (
            p.temperature, p.top_k, p.top_p, p.min_p)
        self.random[row], self.penalties[row], self.min_tokens[row] = not p.greedy, p.uses_penalties, p.min_tokens > 0
        self.logprobs[row], self.top_logprobs[row] = p.logprobs, p.top_logprobs
        self.guided[row] = seq.guide is not None
        if not p.greedy:
            self.ahead.fill(row, seq)

    def may_guess(self, rows: Index) -> BoolArray:
        """Which rows may verify guessed tokens: a penalty depends on the tokens before each position, which
        this step's guesses would have to stand in for. (A grammar's mask does too: it is computed at a copy
        of the sequence's place moved on by those guesses; see `inputs`.)"""
        return ~self.penalties[rows]

    def clear_row(self, row: int, seq: Sequence) -> None:
        if self.random[row]:
            self.ahead.release(row, seq)

    def inputs(self, rows: Index, seqs: list[Sequence], forked: list[int], eos_ids: frozenset[int],
               version: int, by_row: Seq[Sequence | None], guessed: Seq[Seq[int]] | None = None
               ) -> SamplingInputs:
        """Inputs for sampled sequences `seqs`, seqs[i] using the parameters of row rows[i]. `forked` are the
        positions of choices sampling for the first time from their parent's row: their own generators draw
        their uniforms. `version` changes whenever any row changes hands (it keys the reuse). `guessed[i]`: the
        guessed tokens before position i's (a step verifying guesses), which its grammar's mask follows."""
        gathered = self._gather(rows, forked, version)
        uniforms = np.zeros(len(rows), np.float32)
        if gathered.random_rows.size:
            uniforms[gathered.random_at] = self.ahead.draw(gathered.random_rows, by_row)
        for i in forked:
            uniforms[i] = 0.0 if seqs[i].params.greedy else seqs[i].rng.random()
        return SamplingInputs(
            gathered.temperature, gathered.top_k, gathered.top_p, gathered.min_p, uniforms,
            **(_penalty_inputs(seqs) if gathered.penalties else {}),
            suppressed_token_ids=_suppressed(seqs, eos_ids) if gathered.min_tokens else None,
            num_top_logprobs=gathered.num_top_logprobs, want_logprobs=gathered.want_logprobs,
            allowed=_masks(seqs, gathered.guided_at, guessed) if gathered.guided_at.size else None)

    def _gather(self, rows: Index, forked: list[int], version: int) -> _Gathered:
        key = (version, rows.tobytes())
        if not forked and self._last is not None and self._last[0] == key:
            return self._last[1]
        random_at = np.flatnonzero(self.random[rows])
        if forked:
            random_at = np.setdiff1d(random_at, forked)
        gathered = _Gathered(
            _frozen(self.temperature[rows]), _frozen(self.top_k[rows]), _frozen(self.top_p[rows]),
            _frozen(self.min_p[rows]), random_at, rows[random_at], bool(self.penalties[rows].any()),
            bool(self.min_tokens[rows].any()), int(self.top_logprobs[rows].max()), bool(self.logprobs[rows].any()),
            np.flatnonzero(self.guided[rows]))
        if not forked:
            self._last = (key, gathered)
        return gathered


def _masks(seqs: list[Sequence], positions: Index, guessed: Seq[Seq[int]] | None) -> PendingMasks:
    """Start the grammar masks of the guided sequences among `seqs` (they run while the backend does); a
    guessed position's at a copy of its place moved on by the guesses before it."""
    guides = [g if not guessed or not guessed[i] else g.after(guessed[i])
              for i in positions.tolist() if (g := seqs[i].guide) is not None]
    assert len(guides) == len(positions), "a guided row's sequence has no guide"
    return guides[0].factory.masks(guides, positions.astype(np.int32))


def _frozen(array: np.ndarray) -> np.ndarray:
    """Shared by the steps that reuse it: read-only, so no consumer can change another step's inputs."""
    array.flags.writeable = False
    return array


def _penalty_inputs(seqs: list[Sequence]) -> dict[str, np.ndarray]:
    """Penalty inputs (they follow each sequence's output, so they are built every step they are used)."""
    params = [s.params for s in seqs]
    return {
        "presence_penalty": np.array([p.presence_penalty for p in params], np.float32),
        "frequency_penalty": np.array([p.frequency_penalty for p in params], np.float32),
        "repetition_penalty": np.array([p.repetition_penalty for p in params], np.float32),
        "output_token_ids": _padded([s.output_token_ids for s in seqs]),
        "prompt_token_ids": _padded([s.token_ids[: s.prompt_len] for s in seqs]),
    }


def _suppressed(seqs: list[Sequence], eos_ids: frozenset[int]) -> LongArray | None:
    """Until min_tokens are out, a sequence may not sample EOS or its stop tokens."""
    lists = [_banned(s, eos_ids) for s in seqs]
    return _padded(lists) if any(lists) else None


def _banned(seq: Sequence, eos_ids: frozenset[int]) -> list[int]:
    # A grammar decides where its answer ends: banning EOS once it is complete would leave no token at all.
    if seq.num_output_tokens >= seq.params.min_tokens or seq.guide is not None:
        return []
    return sorted(set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else eos_ids))


def _padded(lists: list[list[int]]) -> LongArray:
    width = max((len(x) for x in lists), default=0) or 1
    out = np.full((len(lists), width), -1, np.int64)
    for i, ids in enumerate(lists):
        out[i, : len(ids)] = ids
    return out
