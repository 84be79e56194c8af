"""CUDA graphs for decode steps: a step whose every sequence brings one token runs as the replay of a graph
captured once for its batch-size bucket, padded up to the bucket (graph_inputs.py), instead of some hundred
launches from Python. Mixed and prefill steps run eagerly.

Each bucket holds two graphs over the same static buffers: the forward (every layer, then the logits of every
row) and the sampling of those logits (graph_sampling.py), replayed when the step's sampling options allow it;
otherwise the eager sampler reads the forward graph's logits. Buckets are vLLM's capture sizes: 1, 2, 4, then
multiples of 8 up to the configured maximum (itself a bucket). Graphs read the KV cache at the address they were
captured with: the backend makes new ones with each cache.

The capture itself is the device's (Device.graphs: CUDA stream capture on a GPU, a recording stand-in in the
emulation tests); before a bucket's capture its forward runs once eagerly on padding, so that everything a first
run sets up (compiled elementwise kernels, library workspaces) exists before the capture.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.base import SamplingInputs, StepBatch
from backends.config import CUDA_GRAPH_MODES
from backends.cupy_backend.device import Device, GraphCapture
from backends.cupy_backend.graph_inputs import StaticInputs, allocate_inputs
from backends.cupy_backend.graph_sampling import sample_in_graph
from backends.cupy_backend.step_inputs import DeviceStep
from backends.sampling import SampleResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphSettings:
    mode: str = "off"
    max_batch: int = 256

    def __post_init__(self) -> None:
        if self.mode not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {CUDA_GRAPH_MODES}, not {self.mode!r}")
        if self.max_batch < 1:
            raise ValueError(f"cuda_graph_max_batch must be at least 1, not {self.max_batch}")


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, ... up to max_batch, and max_batch itself."""
    sizes = [s for s in (1, 2, 4, *range(8, max_batch + 1, 8)) if s <= max_batch]
    return tuple(sizes if sizes[-1] == max_batch else [*sizes, max_batch])


def bucket_for(rows: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest size holding `rows`; None past the largest."""
    return next((s for s in sizes if s >= rows), None)


def pure_decode(batch: StepBatch, max_blocks: int) -> bool:
    """One new token per sequence, every sequence sampled at it, tables (the window pool's too) no wider than
    the graphs': the steps a decode graph computes exactly."""
    n = batch.num_seqs
    if n == 0 or batch.num_tokens != n or batch.sampling is None:
        return False
    widths = [t.shape[1] for t in (batch.block_tables, batch.window_tables) if t is not None]
    if max(widths) > max_blocks or not np.array_equal(batch.sample_rows, np.arange(n)):
        return False
    return batch.sample_lag is None or not np.asarray(batch.sample_lag).any()


@dataclass
class BucketGraph:
    inputs: StaticInputs
    forward: Any  # the device's graph: every layer, then the logits of every row into `logits`
    logits: Any  # (rows, vocab) float32
    sampling: Any  # the device's graph: sample_in_graph over `logits` into token_ids and logprobs
    token_ids: Any
    logprobs: Any


@dataclass
class DecodeGraphs:
    """The buckets' graphs for one KV cache. `run_forward(step)` runs the forward and returns the logits of the
    step's sampled rows (writing the step's K/V)."""

    settings: GraphSettings
    device: Device
    run_forward: Callable[[DeviceStep], Any]
    max_blocks: int
    block_size: int
    window_pool: bool = False  # the cache has a window pool: every step brings its tables and slots
    graphs: dict[int, BucketGraph] = field(default_factory=dict)

    @property
    def sizes(self) -> tuple[int, ...]:
        return capture_sizes(self.settings.max_batch)

    def bucket(self, batch: StepBatch) -> int | None:
        """The bucket whose graph computes this step; None: the step runs eagerly."""
        if self.settings.mode == "off" or not pure_decode(batch, self.max_blocks):
            return None
        return bucket_for(batch.num_seqs, self.sizes)

    def capture_all(self) -> None:
        """Every bucket, largest first (its memory is the most the others need), timed and measured."""
        start = time.perf_counter()
        for size in reversed(self.sizes):
            self.get(size)
        log.info("CUDA graphs: %d decode buckets (batch 1 to %d) captured in %.1f s, %.1f MiB of device memory",
                 len(self.graphs), self.settings.max_batch, time.perf_counter() - start, self.memory_bytes() / 2**20)

    def memory_bytes(self) -> int:
        """The static buffers and what the device holds for the graphs (their intermediate arrays)."""
        inputs = [g.inputs for g in self.graphs.values()]
        static = sum(int(a.nbytes) for i in inputs for a in (i.ints, i.longs, i.floats))
        return static + (self.device.graphs.memory_bytes() if self.device.graphs is not None else 0)

    def get(self, size: int) -> BucketGraph:
        """The bucket's graphs, captured now if they were not yet."""
        if size not in self.graphs:
            start = time.perf_counter()
            self.graphs[size] = self._capture(size)
            if self.settings.mode == "lazy":  # mid-serving: say what the step waited for
                log.info("CUDA graphs: decode batch %d captured in %.0f ms (%.1f MiB held by the graphs)", size,
                         1e3 * (time.perf_counter() - start), self.memory_bytes() / 2**20)
        return self.graphs[size]

    def forward(self, batch: StepBatch, size: int) -> Any:
        """Replays the bucket's forward on the step (writing its K/V): the (num_seqs, vocab) logits."""
        graph = self.get(size)
        graph.inputs.fill(batch)
        self._replay(graph.forward)
        return graph.logits[: batch.num_seqs]

    def sample(self, size: int, params: SamplingInputs) -> SampleResult:
        """Replays the bucket's sampling on the logits of its last forward (graph_sampling.graphable_sampling
        must hold for `params`)."""
        graph, n = self.graphs[size], len(params.temperature)
        graph.inputs.fill_sampling(params)
        self._replay(graph.sampling)
        return SampleResult(graph.token_ids[:n], graph.logprobs[:n] if params.want_logprobs else None, None, None)

    def _capture(self, size: int) -> BucketGraph:
        graphs, xp = self._graphs(), self.device.xp
        inputs = allocate_inputs(xp, size, self.max_blocks, self.block_size, self.window_pool)
        step, options = inputs.step, inputs.sampling
        warm = self.run_forward(step)  # warm-up, on padding: writes no KV
        self.device.launcher.call(sample_in_graph, xp, warm, *options)
        forward, logits = graphs.capture(lambda: self.run_forward(step))
        sampling, (ids, logprobs) = graphs.capture(
            lambda: self.device.launcher.call(sample_in_graph, xp, logits, *options))
        return BucketGraph(inputs, forward, logits, sampling, ids, logprobs)

    def _replay(self, graph: Any) -> None:
        self._graphs().replay(graph)

    def _graphs(self) -> GraphCapture:
        if self.device.graphs is None:
            raise RuntimeError(f"device {self.device.name} cannot capture graphs")
        return self.device.graphs
