"""The emulated device's stand-in for CUDA graph capture (device.GraphCapture), for the CPU emulation tests.

As on a GPU, a capture runs nothing: the launcher records each kernel launch (its spec and the very argument
arrays: static inputs, weights, the cache, arrays allocated during the capture) and each `call` (the function
and its arguments), and a replay runs the record in order. A `call`'s output is a new array made at capture
(its shape found by running the function once on whatever its inputs hold then) and filled with poison (NaN,
or the type's smallest value) until a replay writes it, so anything that read a captured result before a replay
would see garbage, as it would on a GPU. A replay reads its inputs where the capture found them: a step whose
inputs were not copied into the graph's static buffers replays the old ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass
class Tape:
    """A captured graph: what to run, in order (each op keeps its arrays alive, as a graph keeps its memory)."""

    ops: list[Callable[[], None]] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)  # the calls' outputs: what memory_bytes counts
    kernels: list[str] = field(default_factory=list)  # the captured launches' names

    def replay(self) -> None:
        for op in self.ops:
            op()


def poisoned(value: Any) -> np.ndarray:
    out = np.array(value, copy=True)
    if out.dtype.kind == "f":
        out.fill(np.nan)
    elif out.dtype.kind in "iu":
        out.fill(np.iinfo(out.dtype).min if out.dtype.kind == "i" else np.iinfo(out.dtype).max)
    return out


def write(out: Any, value: Any) -> None:
    if isinstance(out, tuple):
        for o, v in zip(out, value, strict=True):
            np.copyto(o, v)
    else:
        np.copyto(out, value)


def record_call(tape: Tape, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """fn's output arrays, new and poisoned; the tape recomputes fn into them on each replay."""
    with np.errstate(all="ignore"):  # the inputs hold whatever they held: nothing ran yet
        value = fn(*args)
    out = tuple(poisoned(v) for v in value) if isinstance(value, tuple) else poisoned(value)
    tape.arrays += [a for a in (out if isinstance(out, tuple) else (out,))]

    def op() -> None:
        write(out, fn(*args))

    tape.ops.append(op)
    return out


@dataclass
class TapeGraphs:
    """Device.graphs on the emulated device; `launcher` is its RecordingLauncher (emu_device.py)."""

    launcher: Any
    captures: int = 0
    replays: int = 0
    tapes: list[Tape] = field(default_factory=list)

    def capture(self, work: Callable[[], T]) -> tuple[Tape, T]:
        if self.launcher.tape is not None:
            raise RuntimeError("a capture is already under way")
        tape = self.launcher.tape = Tape()
        try:
            result = work()
        finally:
            self.launcher.tape = None
        self.captures += 1
        self.tapes.append(tape)
        return tape, result

    def replay(self, graph: Tape) -> None:
        self.replays += 1
        graph.replay()

    def memory_bytes(self) -> int:
        return sum(int(a.nbytes) for tape in self.tapes for a in tape.arrays)
