from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.base import Backend, BackendError
from backends.config import BackendConfig
from backends.manual_batch import greedy
from backends.model.loader import ModelFiles
from backends.registry import create_backend
from backends.sim_backend import SimBackend
from tests.sim_backend.helpers import backend, decode_batch, seqs, step, with_sampling

PROMPTS = [[101, 202, 303, 404, 505], [7, 8, 9], [4000, 4001, 4002, 4003, 4004, 4005, 4006]]


def generate(files: ModelFiles, prompts: list[list[int]], steps: int, seed: int = 0) -> np.ndarray:
    """(len(prompts), steps) tokens from prefill then greedy decode, all prompts in one batch."""
    sim, states = backend(files, seed=seed), seqs(len(prompts))
    out = [sim.execute(step(states, prompts)).token_ids]
    for _ in range(steps - 1):
        out.append(sim.execute(step(states, [[int(t)] for t in out[-1]])).token_ids)
    return np.stack(out, axis=1)


def test_create_through_the_registry(files: ModelFiles) -> None:
    sim = create_backend(BackendConfig(name="sim", sim_profile="h200", sim_clock="virtual"), files)
    assert isinstance(sim, Backend) and isinstance(sim, SimBackend) and sim.name == "sim"
    geo = sim.kv_geometry
    assert (geo.num_layers, geo.num_kv_heads, geo.head_dim, geo.dtype_bytes) == (30, 3, 64, 2)
    sim.init_cache(100, 16)
    assert (sim.num_blocks, sim.block_size) == (100, 16)
    assert geo.window_layers == 0  # so it is never given a window pool
    with pytest.raises(BackendError, match="window_blocks must be 0"):
        sim.init_cache(100, 16, window_blocks=8)


def test_cpu_profile_keeps_the_numpy_models_fp32_kv(files: ModelFiles) -> None:
    assert backend(files, profile="cpu").kv_geometry.dtype_bytes == 4


@pytest.mark.parametrize("config", [BackendConfig(name="sim", sim_profile="tpu"),
                                    BackendConfig(name="sim", sim_clock="tpu")])
def test_unknown_profile_or_clock_is_a_backend_error(files: ModelFiles, config: BackendConfig) -> None:
    with pytest.raises(BackendError, match="tpu"):
        create_backend(config, files)


def test_same_inputs_give_the_same_tokens(files: ModelFiles) -> None:
    assert np.array_equal(generate(files, PROMPTS, 12), generate(files, PROMPTS, 12))


def test_a_rows_tokens_do_not_depend_on_its_batch(files: ModelFiles) -> None:
    together = generate(files, PROMPTS, 10)
    for i, prompt in enumerate(PROMPTS):
        assert np.array_equal(generate(files, [prompt], 10)[0], together[i])
    reordered = generate(files, [PROMPTS[2], [1234, 99], PROMPTS[0]], 10)
    assert np.array_equal(reordered[0], together[2]) and np.array_equal(reordered[2], together[0])


def test_chunked_prefill_and_recompute_give_the_same_token(files: ModelFiles) -> None:
    sim = backend(files)
    whole = sim.execute(step(seqs(1), [PROMPTS[2]])).token_ids
    states = seqs(1)
    assert sim.execute(step(states, [PROMPTS[2][:4]], sample=False)).token_ids.shape == (0,)
    assert np.array_equal(sim.execute(step(states, [PROMPTS[2][4:]])).token_ids, whole)
    generated = generate(files, [PROMPTS[0]], 6)[0]
    recomputed = sim.execute(step(seqs(1), [PROMPTS[0] + generated[:5].tolist()])).token_ids
    assert recomputed[0] == generated[5]  # a preempted sequence re-prefills prompt + output: same next token


def test_outputs_follow_sample_rows(files: ModelFiles) -> None:
    sim, states = backend(files), seqs(3)
    batch = step(states, PROMPTS)
    full = sim.execute(batch).token_ids
    picked = replace(batch, sample_rows=np.array([2, 0], np.int32), sampling=greedy(2))
    assert sim.execute(picked).token_ids.tolist() == [full[2], full[0]]


def test_seeds_matter_for_sampled_rows_only(files: ModelFiles) -> None:
    sim = backend(files)
    batch = decode_batch([500] * 64, [20] * 64)
    uniforms = np.linspace(0.01, 0.99, 64)
    greedy_rows = sim.execute(with_sampling(batch, [0.0] * 64, uniforms)).token_ids
    assert len(set(greedy_rows.tolist())) == 1  # same last token and position: uniforms ignored
    sampled = sim.execute(with_sampling(batch, [0.8] * 64, uniforms)).token_ids
    assert len(set(sampled.tolist())) > 60
    again = sim.execute(with_sampling(batch, [0.8] * 64, uniforms)).token_ids
    assert np.array_equal(sampled, again)


def test_the_backend_seed_changes_tokens(files: ModelFiles) -> None:
    a, b = generate(files, PROMPTS, 8, seed=0), generate(files, PROMPTS, 8, seed=1)
    assert (a != b).mean() > 0.9


def test_tokens_are_never_special_or_eos_and_always_text(files: ModelFiles) -> None:
    rng = np.random.default_rng(0)
    n = 4096
    batch = decode_batch(rng.integers(0, 49152, n).tolist(), rng.integers(1, 8192, n).tolist())
    tokens = backend(files).execute(with_sampling(batch, rng.uniform(0, 2, n), rng.random(n))).token_ids
    tok = files.tokenizer
    forbidden = set(tok.special_ids) | set(tok.eos_token_ids) | set(files.config.eos_token_ids)
    assert not forbidden & set(tokens.tolist())
    assert tokens.min() >= 0 and tokens.max() < files.config.vocab_size
    assert all("\ufffd" not in tok.decode([int(t)]) for t in tokens)
    assert len(set(tokens.tolist())) > n * 0.9  # spread over the vocabulary


def test_suppressed_ids_are_avoided(files: ModelFiles) -> None:
    sim = backend(files)
    batch = decode_batch([42] * 8, list(range(10, 18)))
    natural = sim.execute(batch).token_ids
    assert batch.sampling is not None
    suppressed = replace(batch.sampling, suppressed_token_ids=np.stack([natural, np.full(8, -1)], axis=1))
    avoided = sim.execute(replace(batch, sampling=suppressed)).token_ids
    assert not np.any(avoided == natural)
