"""The official OpenAI client against a real server (real engine, sim backend) on loopback."""

from __future__ import annotations

import pytest
from openai import NotFoundError, OpenAI

from tests.service.live import LiveServer

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def client(sim_server: LiveServer) -> OpenAI:
    return OpenAI(base_url=sim_server.url + "/v1", api_key="unused", max_retries=0)


def test_completion(client: OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=12, temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == MODEL
    [choice] = out.choices
    assert choice.text and choice.finish_reason == "length" and choice.index == 0
    assert out.usage is not None and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_streamed_completion_matches_unstreamed(client: OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="Hello there", max_tokens=12, temperature=0,
                                            stream=True))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat(client: OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, seed=3)  # type: ignore[arg-type]
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.usage is not None and out.usage.completion_tokens == 8


def test_chat_stream_with_usage_chunk(client: OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, stream=True,  # type: ignore
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_n2_streams_interleaved_choices(client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, n=2, stream=True,  # type: ignore
                                                 seed=7, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.add(choice.index)
    assert finished == {0, 1} and texts[0] and texts[1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_n2_unstreamed(client: OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Once", max_tokens=5, n=2, seed=1)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage is not None and out.usage.completion_tokens == 10


def test_stop_string_ends_the_text(client: OpenAI) -> None:
    base = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0)
    text = base.choices[0].text
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    out = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0, stop=[stop])
    assert out.choices[0].text == text[:text.index(stop)]
    assert out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(stop)]


def test_completion_logprobs_shape(client: OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, logprobs=2, temperature=0)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    assert lp.token_logprobs is not None and all(v <= 0 for v in lp.token_logprobs)
    assert lp.top_logprobs is not None and all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert lp.text_offset is not None and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == out.choices[0].text


def test_chat_logprobs_shape(client: OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, logprobs=True,  # type: ignore
                                         top_logprobs=2)
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.bytes for t in content)


def test_batch_of_prompts(client: OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=["one", "two", "three"], max_tokens=3, n=2)
    assert [c.index for c in out.choices] == list(range(6))
    assert out.usage is not None and out.usage.completion_tokens == 18


def test_models(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(NotFoundError):
        client.models.retrieve("gpt-9")
