"""bench.precision's prompts: chat prompts through the model's template, or the plain text for a base model."""

from __future__ import annotations

from pathlib import Path

from backends.model.loader import LoadedModel, load_model
from bench.precision import TOPICS, prompts
from tests.backends.tiny_gguf import write_tiny_llama


def test_a_model_without_a_chat_template_gets_its_plain_prompts(tmp_path: Path) -> None:
    model = load_model(write_tiny_llama(tmp_path / "tiny.gguf"))
    tokenizer = model.files.tokenizer
    assert prompts(model, 2) == [tokenizer.encode_prompt(f"Explain {topic}.") for topic in TOPICS[:2]]


def test_a_chat_model_gets_its_template(real_model_stored: LoadedModel) -> None:
    model = real_model_stored
    rendered = model.files.chat_template.render([{"role": "user", "content": f"Explain {TOPICS[0]}."}])
    assert prompts(model, 1) == [model.files.tokenizer.encode(rendered)]
