"""bench.synthetic_checkpoint: a random checkpoint in SmolLM2's shape loads as SmolLM2 does, with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from backends.model.loader import load_model, open_model
from bench.synthetic_checkpoint import write_smollm2_checkpoint


def test_the_random_checkpoint_has_smollm2s_shape_and_tokenizer(tmp_path: Path) -> None:
    _, files = open_model(write_smollm2_checkpoint(tmp_path / "ckpt", num_layers=2))
    model = load_model(files=files)
    c = model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (
        2, 576, 9, 3, 64, 49152)
    assert files.tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]  # SmolLM2's ids
    embedding = np.asarray(model.weights.embedding, np.float32)
    assert abs(float(embedding.std()) - 576**-0.5) < 2e-3 and np.all(model.weights.final_norm == 1.0)
