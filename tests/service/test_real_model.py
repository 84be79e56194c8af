"""The real SmolLM2 model on the NumPy backend, through HTTP: greedy output equals the golden fixture, which
an independent implementation (transformers) computed from the same GGUF."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from backends.model.loader import ModelFiles
from backends.numpy_backend.native.cpu_tiers import CpuInfo
from tests.service.live import numpy_client

GOLDEN = Path(__file__).parents[1] / "golden" / "smollm2_golden.json"
MODEL = "SmolLM2-135M-Instruct"
STREAMED_TOKENS = 12


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def client(model_files: ModelFiles) -> Iterator[OpenAI]:
    with numpy_client(model_files, max_model_len=512, num_blocks=64, timeout=120) as c:
        yield c


def prompt_case(golden: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in golden["prompts"] if p["name"] == name)


@pytest.mark.slow
def test_greedy_completion_equals_golden(client: OpenAI, golden: dict[str, Any], model_files: ModelFiles) -> None:
    case = prompt_case(golden, "code")  # the case with the widest top-2 logit margins
    ids = case["greedy_ids"][:STREAMED_TOKENS]  # a prefix keeps this test short on a 2-core machine
    stream = client.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=len(ids), temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == model_files.tokenizer.decode(ids)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(case["token_ids"])


@pytest.mark.slow
def test_greedy_chat_equals_golden(client: OpenAI, golden: dict[str, Any]) -> None:
    case = prompt_case(golden, "chat")
    out = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=16,
                                         messages=[{"role": "user", "content": golden["chat_user_message"]}])
    assert out.usage is not None and out.usage.prompt_tokens == len(case["token_ids"])
    assert case["greedy_stopped_on_eos"] and out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == case["greedy_text"].removesuffix("<|im_end|>")


def test_metrics_name_the_cpu_tier_the_kernels_were_built_for(client: OpenAI) -> None:
    """backend_info: what runs the model, the tier as the start-up log says it (the highest this CPU runs)."""
    metrics = urllib.request.urlopen(str(client.base_url).removesuffix("/v1/") + "/metrics", timeout=30).read()
    tier = CpuInfo.of_this_host().choose().name
    expected = (f'pagedserve:backend_info{{backend="numpy",cpu_isa="{tier}",cpu_precision="exact",'
                f'kv_cache_dtype="float32",weights="gguf"}} 1.0')
    assert expected in metrics.decode().splitlines()
