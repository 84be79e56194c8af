"""CUDA graph capture through CuPy: device.GraphCapture on a GPU.

Capture runs on a stream of its own (the legacy default stream cannot capture), in CuPy's relaxed mode, with
every array allocated meanwhile taken from a memory pool of the graphs' own: an array freed during a capture goes
back to that pool only, so memory a graph writes on replay never serves eager work. One pool serves every graph,
as their replays never overlap and each replay writes every intermediate before reading it; the arrays a graph's
caller reads afterwards (logits, sampled ids) stay alive with the caller. A graph is replayed on the current
stream, in order with the copies into its static buffers before it and the reads of its outputs after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class CupyGraphs:
    cupy: Any
    stream: Any  # cupy.cuda.Stream, non-blocking
    pool: Any  # cupy.cuda.MemoryPool

    @classmethod
    def create(cls, cupy: Any) -> CupyGraphs:
        return cls(cupy, cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool())

    def capture(self, work: Callable[[], T]) -> tuple[Any, T]:
        self.cupy.cuda.get_current_stream().synchronize()  # the capture stream is not ordered after it
        with self.stream, self.cupy.cuda.using_allocator(self.pool.malloc):
            self.stream.begin_capture()
            try:
                result = work()
            finally:
                graph = self.stream.end_capture()
        return graph, result

    def replay(self, graph: Any) -> None:
        graph.launch(self.cupy.cuda.get_current_stream())

    def memory_bytes(self) -> int:
        return int(self.pool.total_bytes())
