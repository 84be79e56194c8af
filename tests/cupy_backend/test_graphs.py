"""The decode graphs' host-side logic, without kernels: buckets, which steps are graphable, the static inputs'
padding, the graph sampler against the eager one, the settings, and the CuPy capture glue on a stand-in. (Capture
and replay of whole steps run in the graphs-* emulation scenarios, emu_graph_scenarios.py.)"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from backends.base import SamplingInputs, StepBatch
from backends.config import BackendConfig
from backends.cupy_backend.capture import CupyGraphs
from backends.cupy_backend.graph_inputs import allocate_inputs
from backends.cupy_backend.graph_sampling import graphable_sampling, sample_in_graph
from backends.cupy_backend.graphs import GraphSettings, bucket_for, capture_sizes, pure_decode
from backends.manual_batch import SeqState, greedy, make_batch
from backends.sampling import sample

BLOCK = 4


def test_capture_sizes_follow_the_bucket_list_up_to_the_maximum() -> None:
    sizes = capture_sizes(256)
    assert sizes[:6] == (1, 2, 4, 8, 16, 24) and sizes[-1] == 256 and len(sizes) == 35
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:], strict=False))
    assert capture_sizes(100)[-2:] == (96, 100)  # the maximum is a bucket of its own
    assert capture_sizes(1) == (1,) and capture_sizes(3) == (1, 2, 3) and capture_sizes(8) == (1, 2, 4, 8)


def test_a_step_takes_the_smallest_bucket_holding_it() -> None:
    sizes = capture_sizes(32)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 24, 32]
    assert bucket_for(33, sizes) is None


def _seqs(count: int, tokens: int) -> list[SeqState]:
    return [SeqState(blocks=[10 * i + j for j in range(4)], tokens=[3] * tokens) for i in range(count)]


def test_only_pure_decode_steps_are_graphable() -> None:
    decode = make_batch(_seqs(3, 5), [[1], [2], [3]], BLOCK)
    assert pure_decode(decode, max_blocks=4)
    assert not pure_decode(decode, max_blocks=3)  # tables wider than the graphs'
    assert not pure_decode(make_batch(_seqs(2, 5), [[1], [2, 3]], BLOCK), 4)  # mixed
    assert not pure_decode(make_batch(_seqs(1, 0), [[1, 2, 3]], BLOCK), 4)  # prefill
    assert not pure_decode(make_batch(_seqs(2, 5), [[1], [2]], BLOCK, sample=False), 4)
    assert not pure_decode(replace(decode, sample_lag=np.array([0, 1, 0], np.int32)), 4)
    assert pure_decode(replace(decode, sample_lag=np.zeros(3, np.int32)), 4)
    assert not pure_decode(replace(decode, sample_rows=np.array([0, 2], np.int32), sampling=greedy(2)), 4)


def test_static_inputs_pad_with_rows_that_write_and_read_no_kv() -> None:
    inputs = allocate_inputs(np, rows=4, max_blocks=5, block_size=BLOCK)
    batch = make_batch(_seqs(3, 5), [[7], [8], [9]], BLOCK)
    inputs.fill(batch)
    step = inputs.step
    assert step.token_ids.tolist() == [7, 8, 9, 0] and step.positions.tolist() == [5, 5, 5, 0]
    assert step.slot_mapping.tolist() == [*batch.slot_mapping.tolist(), -1]
    assert step.context_lens.tolist() == [6, 6, 6, 0] and step.query_start.tolist() == [0, 1, 2, 3, 4]
    assert step.block_tables[:3, :4].tolist() == batch.block_tables.tolist() and not step.block_tables[3].any()
    assert not step.block_tables[:, 4].any() and step.sample_rows.tolist() == [0, 1, 2, 3]
    assert (step.num_seqs, step.max_query_len, step.max_context_len, step.decode_only) == (4, 1, 20, True)
    inputs.fill(make_batch(_seqs(1, 2), [[4]], BLOCK))  # a smaller step after a larger: the rest is padding again
    assert step.token_ids.tolist() == [4, 0, 0, 0] and step.slot_mapping.tolist()[1:] == [-1, -1, -1]
    assert step.context_lens.tolist() == [3, 0, 0, 0] and not step.block_tables[1:].any()


def _windowed(batch: StepBatch, width: int) -> StepBatch:
    """batch with window pool tables (-1 for a block given back) and slots of its own."""
    tables = np.full((batch.num_seqs, width), -1, np.int32)
    tables[:, -1] = 100 + np.arange(batch.num_seqs)
    return replace(batch, window_tables=tables, window_slots=(100 + np.arange(batch.num_tokens)) * BLOCK)


def test_window_pool_steps_are_graphable_with_tables_no_wider_than_the_graphs() -> None:
    decode = make_batch(_seqs(3, 5), [[1], [2], [3]], BLOCK)
    assert pure_decode(_windowed(decode, 4), max_blocks=4)
    assert not pure_decode(_windowed(decode, 5), max_blocks=4)


def test_static_inputs_hold_the_window_pools_tables_and_slots() -> None:
    inputs = allocate_inputs(np, rows=4, max_blocks=5, block_size=BLOCK, window_pool=True)
    batch = _windowed(make_batch(_seqs(3, 5), [[7], [8], [9]], BLOCK), 2)
    inputs.fill(batch)
    step, window = inputs.step, inputs.step.in_window_pool()
    assert step.slot_mapping.tolist() == [*batch.slot_mapping.tolist(), -1]
    assert batch.window_slots is not None and batch.window_tables is not None
    assert window.slot_mapping.tolist() == [*batch.window_slots.tolist(), -1]
    assert step.block_tables[:3, :4].tolist() == batch.block_tables.tolist() and not step.block_tables[3].any()
    assert window.block_tables[:3, :2].tolist() == batch.window_tables.tolist() and not window.block_tables[3].any()
    assert not window.block_tables[:, 2:].any() and step.query_start.tolist() == [0, 1, 2, 3, 4]
    assert step.sample_rows.tolist() == [0, 1, 2, 3] and step.context_lens.tolist() == [6, 6, 6, 0]


def _params(n: int, rng: np.random.Generator, **changes: Any) -> SamplingInputs:
    temperature = np.where(np.arange(n) % 3 == 0, 0.0, rng.uniform(0.3, 1.5, n)).astype(np.float32)
    min_p = np.where(np.arange(n) % 2 == 0, 0.0, 0.05).astype(np.float32)
    params = SamplingInputs(temperature=temperature, top_k=np.zeros(n, np.int32), top_p=np.ones(n, np.float32),
                            min_p=min_p, uniforms=rng.uniform(0, 1, n).astype(np.float32), want_logprobs=True)
    return replace(params, **changes)


def test_the_graph_sampler_gives_the_eager_samplers_tokens() -> None:
    rng = np.random.default_rng(0)
    logits = (3 * rng.standard_normal((24, 500))).astype(np.float32)
    params = _params(24, rng)
    want = sample(np, logits, params)
    ids, logprobs = sample_in_graph(np, logits, params.temperature, params.min_p, params.uniforms)
    assert want.logprobs is not None
    assert ids.tolist() == want.token_ids.tolist() and np.array_equal(logprobs, want.logprobs)
    assert len(set(ids.tolist())) > 12  # random rows drew different tokens: not every row greedy
    greedy_rows = params.temperature == 0
    assert (ids[greedy_rows] == logits[greedy_rows].argmax(axis=-1)).all()


def test_options_the_graph_sampler_lacks_keep_the_eager_one() -> None:
    rng = np.random.default_rng(1)
    assert graphable_sampling(_params(4, rng))
    ids = np.full((4, 2), -1, np.int64)
    for changes in ({"top_k": np.array([0, 5, 0, 0], np.int32)}, {"top_p": np.array([1, 1, 0.9, 1], np.float32)},
                    {"num_top_logprobs": 2}, {"presence_penalty": np.zeros(4, np.float32), "output_token_ids": ids},
                    {"suppressed_token_ids": ids}):
        assert not graphable_sampling(_params(4, rng, **changes)), changes


def test_settings_are_checked() -> None:
    assert BackendConfig().cuda_graphs == "eager" and BackendConfig().cuda_graph_max_batch == 256
    with pytest.raises(ValueError, match="cuda_graphs"):
        BackendConfig(cuda_graphs="always")
    with pytest.raises(ValueError, match="cuda_graph_max_batch"):
        BackendConfig(cuda_graph_max_batch=0)
    with pytest.raises(ValueError, match="cuda_graphs"):
        GraphSettings("sometimes")


class _Stream:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self) -> None:
        self.log.append("enter stream")

    def __exit__(self, *exc: object) -> None:
        self.log.append("exit stream")

    def begin_capture(self) -> None:
        self.log.append("begin")

    def end_capture(self) -> Any:
        self.log.append("end")
        return SimpleNamespace(launch=lambda stream: self.log.append(f"launch on {stream}"))

    def synchronize(self) -> None:
        self.log.append("synchronize")


def test_cupy_capture_runs_the_work_on_its_stream_from_its_pool() -> None:
    log: list[str] = []
    pool = SimpleNamespace(malloc="pool.malloc", total_bytes=lambda: 1234)

    class Using:
        def __init__(self, malloc: str) -> None:
            log.append(f"allocate from {malloc}")

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            log.append("allocator restored")

    current = _Stream(log)
    cuda = SimpleNamespace(get_current_stream=lambda: current, using_allocator=Using)
    graphs = CupyGraphs(SimpleNamespace(cuda=cuda), _Stream(log), pool)
    def work() -> str:
        log.append("work")
        return "out"

    graph, result = graphs.capture(work)
    assert result == "out"
    assert log == ["synchronize", "enter stream", "allocate from pool.malloc", "begin", "work", "end",
                   "allocator restored", "exit stream"]
    graphs.replay(graph)
    assert log[-1] == f"launch on {current}" and graphs.memory_bytes() == 1234
