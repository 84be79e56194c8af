"""A model without a chat template (Gemma 3's base GGUF, say): chat requests are refused with 400 naming the
fix, as vLLM does, never answered through a guessed format; completions still work; `--chat-template FILE`
(backend.chat_template) gives it one, or replaces a model's own."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from backends.model.chat_template import ChatTemplate
from backends.model.config import ModelLoadError
from backends.model.loader import ModelFiles, open_model
from tests.backends.tiny_gguf import write_tiny_llama
from tests.service.live import LiveServer, cached_builder, sim_config

MODEL = "SmolLM2-135M-Instruct"  # the served model's name: the sim server tokenizes with its files
GEMMA_STYLE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
               "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def untemplated(model_files: ModelFiles) -> Iterator[OpenAI]:
    files = dataclasses.replace(model_files, chat_template=ChatTemplate(None))
    server = LiveServer.start(sim_config(), cached_builder(files))
    yield OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    server.close()


def test_a_chat_request_without_a_template_gets_400_naming_the_setting(untemplated: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        untemplated.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert "no chat template" in error["message"] and "--chat-template" in error["message"]


def test_completions_still_work_without_a_template(untemplated: OpenAI) -> None:
    out = untemplated.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens == 3


def test_a_template_file_gives_a_model_one_and_replaces_its_own(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    assert open_model(path)[1].chat_template.source is None  # the tiny file has none
    template = tmp_path / "gemma.jinja"
    template.write_text(GEMMA_STYLE)
    files = open_model(path, template)[1]
    text = files.chat_template.render([{"role": "user", "content": "hi"}])
    assert text.endswith("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    assert files.chat_template.source == open_model(None, template)[1].chat_template.source  # the default's too


def test_an_unreadable_template_file_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"^chat template .*missing\.jinja: No such file or directory$"):
        open_model(write_tiny_llama(tmp_path / "tiny.gguf"), tmp_path / "missing.jinja")


def test_generate_with_chat_on_a_model_without_one_says_so(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    cmd = [sys.executable, "-m", "service", "generate", "--model", str(path), "--backend", "sim", "--chat",
           "--prompt", "hi", "--max-tokens", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "no chat template" in done.stderr and "Traceback" not in done.stderr
