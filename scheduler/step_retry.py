"""A failed step re-run without the requests it cannot trust, so that one request whose input makes the backend
raise fails alone.

When the backend raises on a step of several requests, the cause may be one request's (an input the backend
cannot take) or nobody's (a passing fault). The step is re-run in halves of its requests: a half that succeeds
keeps its rows' results; when exactly one half fails, the search goes on inside it, until one request is
left, which fails alone. When both halves fail there is more than one cause, and every request of both fails.
Each round costs two sub-steps, so a step of R requests costs at most 2 x ceil(log2 R) of them, and a
deadline bounds the whole search.

A sub-step is the same step restricted to some sequences: the same slots, positions and sampling inputs, so
each row computes exactly what it would have computed in the whole step (a request's tokens never depend on
its batch), and re-writing a slot writes the same K/V. Sequences that read a block another sequence writes in
this step (a prefix-cache hit on a block being filled) are never split apart: they form one unit with it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.base import AllowedTokens, IntArray, LongArray, SamplingInputs, StepBatch, StepOutput

Rows = npt.NDArray[np.intp]  # indices into a step's sequences or its sampled entries
RunPart = Callable[[StepBatch], Awaitable[StepOutput | None]]  # a sub-step's output; None when it failed
Unit = tuple[int, ...]  # batch rows (indices into StepBatch.seq_ids) that succeed or fail together


@dataclass(frozen=True)
class Isolation:
    """What the search found: each sub-step's rows and output, and the units it could not clear."""

    parts: list[tuple[Rows, StepOutput]]
    failed: list[Unit]

    @property
    def recovered(self) -> bool:
        return bool(self.parts)


async def isolate(run: RunPart, batch: StepBatch, units: list[Unit], block_size: int, deadline: float
                  ) -> Isolation:
    """Bisect `units` (the failed step's, at least two) by re-running halves of them; `deadline` is on
    time.monotonic()'s clock: past it, the units still suspect fail."""
    parts: list[tuple[Rows, StepOutput]] = []
    suspects = units
    while len(suspects) > 1 and time.monotonic() < deadline:
        halves = suspects[: len(suspects) // 2], suspects[len(suspects) // 2:]
        failed = [half for half in halves if not await _try(run, batch, half, block_size, parts)]
        if len(failed) != 1:
            return Isolation(parts, [unit for half in failed for unit in half])
        suspects = failed[0]
    return Isolation(parts, list(suspects))


async def _try(run: RunPart, batch: StepBatch, units: Sequence[Unit], block_size: int,
               parts: list[tuple[Rows, StepOutput]]) -> bool:
    rows = np.array(sorted(row for unit in units for row in unit), np.intp)
    output = await run(sub_batch(batch, rows, block_size))
    if output is not None:
        parts.append((rows, output))
    return output is not None


def units_of(batch: StepBatch, request_ids: Sequence[str], block_size: int) -> list[Unit]:
    """The batch's rows grouped into units: the rows of one request (its choices share blocks), joined with
    every row whose blocks include a block that another unit's row writes in this step."""
    owner = _UnionFind(len(request_ids))
    first_row: dict[str, int] = {}
    for row, request_id in enumerate(request_ids):
        owner.join(row, first_row.setdefault(request_id, row))
    _join_readers(owner, batch, batch.block_tables, batch.slot_mapping, block_size)
    if batch.window_tables is not None and batch.window_slots is not None:  # the sliding layers' own pool
        _join_readers(owner, batch, batch.window_tables, batch.window_slots, block_size)
    return owner.groups()


def _join_readers(owner: _UnionFind, batch: StepBatch, tables: IntArray, slots: LongArray, block_size: int
                  ) -> None:
    """Join each row with the first row that holds a block this step writes (through one pool's tables)."""
    written = set((slots // block_size).tolist())
    holder: dict[int, int] = {}
    for row in range(batch.num_seqs):
        used = -(-int(batch.context_lens[row]) // block_size)
        for block in tables[row, :used].tolist():
            if block in written:
                owner.join(row, holder.setdefault(block, row))


def sub_batch(batch: StepBatch, rows: Rows, block_size: int) -> StepBatch:
    """The step restricted to `rows` (sorted indices into its sequences)."""
    starts, ends = batch.query_start[rows], batch.query_start[rows + 1]
    tokens = np.concatenate([np.arange(s, e) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)])
    kept = np.flatnonzero(np.isin(batch.sample_rows, rows))  # the sampled entries of these rows
    written = set((batch.slot_mapping[tokens] // block_size).tolist())
    return replace(
        batch, seq_ids=tuple(batch.seq_ids[r] for r in rows.tolist()), token_ids=batch.token_ids[tokens],
        positions=batch.positions[tokens], slot_mapping=batch.slot_mapping[tokens],
        query_start=np.concatenate([[0], np.cumsum(ends - starts)]).astype(batch.query_start.dtype),
        context_lens=batch.context_lens[rows], block_tables=batch.block_tables[rows],
        sample_rows=np.searchsorted(rows, batch.sample_rows[kept]).astype(batch.sample_rows.dtype),
        sample_lag=None if batch.sample_lag is None else batch.sample_lag[kept],
        # no sampled row: no inputs, as in any step that samples nothing (a backend then returns no logprobs)
        sampling=None if batch.sampling is None or not kept.size else _sub_sampling(batch.sampling, kept),
        # a copy belongs to the row that writes its destination; re-doing another's would undo that row's writes
        block_copies=tuple(c for c in batch.block_copies if c[1] in written), **_window_part(batch, rows, tokens,
                                                                                          block_size))


def _window_part(batch: StepBatch, rows: Rows, tokens: Rows, block_size: int) -> dict[str, Any]:
    """sub_batch's sliding-layer tables, slots and copies, where the step has them."""
    if batch.window_tables is None or batch.window_slots is None:
        return {}
    slots = batch.window_slots[tokens]
    written = set((slots // block_size).tolist())
    return {"window_tables": batch.window_tables[rows], "window_slots": slots,
            "window_block_copies": tuple(c for c in batch.window_block_copies if c[1] in written)}


def _sub_sampling(sampling: SamplingInputs, kept: Rows) -> SamplingInputs:
    """The sampled entries `kept`: every per-row array sliced (whatever fields the inputs gain), the masks
    subset; num_top_logprobs stays the step's, so every part's arrays are as wide."""
    rows: dict[str, Any] = {f.name: value[kept] for f in fields(sampling)
                            if isinstance(value := getattr(sampling, f.name), np.ndarray)}
    allowed = None if sampling.allowed is None else _SubsetMasks.of(sampling.allowed, kept)
    return replace(sampling, **rows, allowed=allowed)


class _SubsetMasks:
    """The grammar masks of some of a step's sampled entries (backends.base.AllowedTokens)."""

    def __init__(self, parent: AllowedTokens, masks: Rows, positions: IntArray) -> None:
        self._parent, self._masks = parent, masks
        self.positions = positions

    @classmethod
    def of(cls, parent: AllowedTokens, kept: Rows) -> _SubsetMasks | None:
        masks = np.flatnonzero(np.isin(parent.positions, kept))
        if not masks.size:
            return None
        return cls(parent, masks, np.searchsorted(kept, parent.positions[masks]).astype(np.int32))

    def bits(self) -> np.ndarray:
        return self._parent.bits()[self._masks]


def merged_output(batch: StepBatch, parts: list[tuple[Rows, StepOutput]]) -> StepOutput:
    """One output for the whole step from its parts' outputs; entries no part computed (the failed units') hold
    token 0, for the engine to drop with their aborted requests. Each optional array takes its shape from the
    first part that has it (a part that sampled nothing has none). Raises ValueError when parts disagree."""
    size = len(batch.sample_rows)

    def like(name: str) -> np.ndarray | None:
        found = next((v for _, out in parts if (v := getattr(out, name)) is not None), None)
        return None if found is None else np.zeros((size, *found.shape[1:]), found.dtype)

    merged = StepOutput(np.zeros(size, np.int64), like("logprobs"), like("top_token_ids"), like("top_logprobs"))
    for rows, output in parts:
        kept = np.flatnonzero(np.isin(batch.sample_rows, rows))
        merged.token_ids[kept] = output.token_ids
        for mine, theirs in ((merged.logprobs, output.logprobs), (merged.top_token_ids, output.top_token_ids),
                             (merged.top_logprobs, output.top_logprobs)):
            if mine is not None and theirs is not None:
                mine[kept] = theirs
    return merged


class _UnionFind:
    def __init__(self, size: int) -> None:
        self._parent = list(range(size))

    def find(self, item: int) -> int:
        while self._parent[item] != item:
            self._parent[item] = self._parent[self._parent[item]]
            item = self._parent[item]
        return item

    def join(self, a: int, b: int) -> None:
        self._parent[self.find(a)] = self.find(b)

    def groups(self) -> list[Unit]:
        found: dict[int, list[int]] = {}
        for item in range(len(self._parent)):
            found.setdefault(self.find(item), []).append(item)
        return [tuple(rows) for rows in found.values()]
