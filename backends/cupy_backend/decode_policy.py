"""Which decode attention kernel a step takes: the plain one (a block per sequence and head walks the whole
attended span) or the partitioned one (the span split into partition_size pieces, then a reduce).

Which wins depends on the GPU, the grid (sequences x heads) and the span, so it is measured: bench/gpu_check.py's
`decode_sweep` section times both over batch x context x head shape, and `python -m bench.decode_policy RUN.json`
turns that into `decode_policy.json` beside this file, committed with the run it came from. A step takes the
winner at the measured point nearest to it (same head_dim where one was measured; distance in log2 of the grid's
blocks and of the span). Without a table, or for a step the table does not cover (another dtype or partition
size, a span outside the measured ones), the rule in launch.use_partitioned_decode decides.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.cupy_backend import launch

TABLE_PATH = Path(__file__).resolve().parent / "decode_policy.json"
MAX_ANSWERS = 1024  # remembered decisions; a serving run's spans keep growing, so the memo starts over past this


@dataclass(frozen=True)
class Point:
    """One measured configuration and the faster kernel there."""

    blocks: int  # sequences x query heads: the plain kernel's grid
    span: int  # positions each query attends to
    head_dim: int
    partitioned: bool

    def distance(self, blocks: int, span: int) -> float:
        return abs(math.log2(max(blocks, 1) / self.blocks)) + abs(math.log2(max(span, 1) / self.span))


@dataclass(frozen=True)
class DecodePolicy:
    points: tuple[Point, ...] = ()
    measured_on: str = ""  # the device the table came from
    dtype: str = ""  # the KV cache's storage dtype in the sweep
    partition_size: int = launch.DEFAULT_PARTITION_SIZE

    # Answers already given: every layer of an eager step asks the same question (a table's search is ~8 us).
    _answers: dict[tuple[int, int, int, int, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def partitioned(self, span: int, num_seqs: int, num_heads: int, head_dim: int, partition_size: int,
                    dtype: str) -> bool:
        if launch.num_partitions(span, partition_size) == 1:
            return False
        if not self.points:
            return launch.use_partitioned_decode(span, num_seqs, num_heads, partition_size)
        key = (span, num_seqs * num_heads, head_dim, partition_size, dtype)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            answer = self._answers[key] = self._decide(span, num_seqs, num_heads, head_dim, partition_size, dtype)
        return answer

    def _decide(self, span: int, num_seqs: int, num_heads: int, head_dim: int, partition_size: int,
                dtype: str) -> bool:
        """The winner at the nearest measured point, or the rule where the table does not speak."""
        if not self.covers(span, partition_size, dtype):
            return launch.use_partitioned_decode(span, num_seqs, num_heads, partition_size)
        same_dim = [p for p in self.points if p.head_dim == head_dim] or list(self.points)
        return min(same_dim, key=lambda p: p.distance(num_seqs * num_heads, span)).partitioned

    def covers(self, span: int, partition_size: int, dtype: str) -> bool:
        """The table speaks for this step: measured in its dtype and partition size, over spans around its."""
        if not self.points or (partition_size, dtype) != (self.partition_size, self.dtype):
            return False
        return min(p.span for p in self.points) <= span <= max(p.span for p in self.points)

    def describe(self) -> str:
        if not self.points:
            return "the built-in rule (no measured table)"
        spans = sorted({p.span for p in self.points})
        return (f"a table of {len(self.points)} points measured on {self.measured_on} ({self.dtype}, spans "
                f"{spans[0]}-{spans[-1]}; the built-in rule elsewhere)")

    def to_json(self) -> dict[str, Any]:
        return {"measured_on": self.measured_on, "dtype": self.dtype, "partition_size": self.partition_size,
                "points": [vars(p) for p in self.points]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodePolicy:
        points = tuple(Point(int(p["blocks"]), int(p["span"]), int(p["head_dim"]), bool(p["partitioned"]))
                       for p in data["points"])
        if any(p.blocks < 1 or p.span < 1 for p in points):
            raise ValueError("a decode policy point needs at least one block and one position")
        return cls(points, str(data["measured_on"]), str(data["dtype"]), int(data["partition_size"]))


def load_policy(path: Path = TABLE_PATH) -> DecodePolicy:
    """The committed table, or the rule when none was measured yet."""
    if not path.is_file():
        return DecodePolicy()
    return DecodePolicy.from_json(json.loads(path.read_text()))
