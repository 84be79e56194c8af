from __future__ import annotations

import numpy as np
import pytest

from backends.base import StepBatch
from backends.sim_backend import PROFILES, CostModel, ModelShape, get_profile
from tests.sim_backend.helpers import SMOLLM2, decode_batch


def prefill_batch(prompt_len: int, cached: int = 0) -> StepBatch:
    """One sequence prefilling `prompt_len` new tokens after `cached` already in its KV cache."""
    batch = decode_batch([1], [cached + prompt_len])
    return StepBatch(
        seq_ids=(0,), token_ids=np.ones(prompt_len, np.int32),
        positions=np.arange(cached, cached + prompt_len, dtype=np.int32),
        slot_mapping=np.zeros(prompt_len, np.int64), query_start=np.array([0, prompt_len], np.int32),
        context_lens=batch.context_lens, block_tables=batch.block_tables, sample_rows=batch.sample_rows,
        sampling=batch.sampling,
    )


def test_llama_parameter_count_of_the_default_model() -> None:
    shape = ModelShape.of(SMOLLM2)
    # per layer: q,o 576*576 each; k,v 576*192 each; MLP 3*576*1536; two norms 576 each -> 3,540,096
    assert shape.layer_params == 30 * 3_540_096 + 576
    assert shape.head_params == 49152 * 576
    assert shape.streamed_params == 134_515_008  # "135M", embeddings tied
    assert shape.kv_elements_per_token == 2 * 30 * 3 * 64


def test_h100_decode_step_matches_the_hand_computed_cost() -> None:
    cost = CostModel(SMOLLM2, get_profile("h100")).step_cost(decode_batch([5, 6, 7, 8], [10, 20, 30, 40]))
    memory = 134_515_008 * 2 + (100 + 4) * 23_040  # weights + KV read (sum of contexts) + KV written
    flops = 2 * 106_203_456 * 4 + 2 * 28_311_552 * 4 + 4 * 30 * 9 * 64 * 100
    assert cost.memory_bytes == memory == 271_426_176
    assert cost.flops == flops == 1_083_032_064
    assert cost.memory_s == pytest.approx(memory / (3.35e12 * 0.8))
    assert cost.compute_s == pytest.approx(flops / (989e12 * 0.6))
    assert cost.memory_bound
    assert cost.seconds == pytest.approx(memory / 2.68e12 + 1.2e-3)


def test_attention_pairs_of_a_chunk_after_a_cached_prefix() -> None:
    assert prefill_batch(4, cached=10).shape().attention_pairs == 11 + 12 + 13 + 14
    assert prefill_batch(2048).shape().attention_pairs == 2048 * 2049 // 2


@pytest.mark.parametrize("name", ["cpu", "a100", "h100", "h200"])
def test_decode_is_memory_bound_and_long_prefill_compute_bound(name: str) -> None:
    model = CostModel(SMOLLM2, get_profile(name))
    assert model.step_cost(decode_batch([1], [512])).memory_bound
    # on the CPU 8 rows are compute-bound (2.3 GFLOP at 64 GFLOP/s > 560 MB at 25.6 GB/s); on GPUs 64 are not
    assert model.step_cost(decode_batch([1] * 64, [512] * 64)).memory_bound == (name != "cpu")
    assert not model.step_cost(prefill_batch(2048)).memory_bound


@pytest.mark.parametrize("name", ["cpu", "a100", "h100", "h200"])
def test_cost_grows_with_batch_size_and_context(name: str) -> None:
    model = CostModel(SMOLLM2, get_profile(name))
    by_batch = [model.step_cost(decode_batch([1] * n, [256] * n)).seconds for n in (1, 8, 64, 512, 4096)]
    by_context = [model.step_cost(decode_batch([1] * 32, [c] * 32)).seconds for c in (16, 256, 4096, 8192)]
    by_prompt = [model.step_cost(prefill_batch(n)).seconds for n in (16, 256, 2048)]
    for series in (by_batch, by_context, by_prompt):
        assert all(b > a for a, b in zip(series, series[1:], strict=False))


def test_faster_hardware_is_faster() -> None:
    batch = decode_batch([1] * 64, [1024] * 64)
    times = [CostModel(SMOLLM2, get_profile(n)).step_cost(batch).seconds for n in ("cpu", "a100", "h100", "h200")]
    assert times == sorted(times, reverse=True)


def test_zero_profile_costs_nothing() -> None:
    assert CostModel(SMOLLM2, PROFILES["zero"]).step_cost(prefill_batch(2048)).seconds == 0.0


def test_unknown_profile() -> None:
    with pytest.raises(ValueError, match="choose from"):
        get_profile("tpu")
