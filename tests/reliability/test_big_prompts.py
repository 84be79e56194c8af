"""Big prompts cost their sender: a text that cannot fit is refused before it is tokenized, and big texts are
tokenized on the tokenizer threads, never on the event loop (the small usual ones stay inline)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from backends.model.loader import ModelFiles
from backends.model.tokenizer import Tokenizer
from service.config.settings import ServiceConfig
from tests.service.live import LiveServer, cached_builder, sim_config
from tests.service.rawhttp import post

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def big_body_server(model_files: ModelFiles) -> Iterator[LiveServer]:
    server = LiveServer.start(sim_config(ServiceConfig(port=0, max_body_bytes=4 * 1024 * 1024)),
                              cached_builder(model_files))
    yield server
    server.close()


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """(text length, thread name) of every Tokenizer.encode call."""
    calls: list[tuple[int, str]] = []
    real = Tokenizer.encode

    def recording(self: Tokenizer, text: str) -> list[int]:
        calls.append((len(text), threading.current_thread().name))
        return real(self, text)

    monkeypatch.setattr(Tokenizer, "encode", recording)
    return calls


def _context_error(reply: Any) -> dict[str, Any]:
    assert reply.status == 400, reply.body
    error: dict[str, Any] = reply.error()
    assert error["code"] == "context_length_exceeded"
    return error


@pytest.mark.parametrize(("path", "body"), [
    (CMPL, {"prompt": "word " * 380_000}),
    (CMPL, {"prompt": ["short", "word " * 380_000]}),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 380_000}]}),
])
def test_a_text_that_cannot_fit_is_refused_untokenized(big_body_server: LiveServer, encodes: list[tuple[int, str]],
                                                       path: str, body: dict[str, Any]) -> None:
    error = _context_error(post(big_body_server.url + path, body))
    at_least = re.search(r"has at least (\d+) tokens", error["message"])
    assert at_least and int(at_least.group(1)) >= 1_900_000 // 81 and "8192" in error["message"]
    assert all(length < 100_000 for length, _ in encodes)  # the 1.9 MB text never reached the tokenizer


@pytest.mark.parametrize(("path", "body"), [
    (CMPL, {"prompt": "word " * 20_000}),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 20_000}]}),
])
def test_big_texts_are_tokenized_off_the_event_loop(big_body_server: LiveServer, encodes: list[tuple[int, str]],
                                                    path: str, body: dict[str, Any]) -> None:
    error = _context_error(post(big_body_server.url + path, body))  # 20,000 tokens: tokenized, then too long
    counted = re.search(r"has (\d+) tokens", error["message"])
    assert counted and 20_000 <= int(counted.group(1)) < 20_100
    assert [name.startswith("pagedserve-tokenize") for length, name in encodes if length >= 100_000] == [True]


def test_small_prompts_stay_on_the_event_loop(big_body_server: LiveServer, encodes: list[tuple[int, str]]) -> None:
    reply = post(big_body_server.url + CMPL, {"prompt": "Hello there", "max_tokens": 2})
    assert reply.status == 200
    assert [name.startswith("pagedserve-tokenize") for _, name in encodes] == [False]


def test_too_many_prompts_are_refused_before_tokenizing(big_body_server: LiveServer,
                                                        encodes: list[tuple[int, str]]) -> None:
    reply = post(big_body_server.url + CMPL, {"prompt": ["a b"] * 200_000, "max_tokens": 1})
    assert reply.status == 400 and reply.error()["param"] == "n" and "128 choices" in reply.error()["message"]
    assert encodes == []
