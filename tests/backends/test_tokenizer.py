"""Tokenizer, incremental detokenizer and chat template on the default model's vocabulary."""

from __future__ import annotations

import random

import pytest

from backends.model.chat_template import ChatTemplate, ChatTemplateError
from backends.model.loader import ModelFiles, open_model
from backends.model.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "Café naïve façade résumé",
    "東京は日本の首都です。北京、上海",
    "emoji 🚀🔥👩‍👩‍👧 and flags 🇫🇷",
    "digits 1234567 and 3.14159",
    "tabs\tand\nnewlines\n\n  spaces",
]


@pytest.fixture(scope="module")
def files() -> ModelFiles:
    return open_model()[1]


@pytest.fixture(scope="module")
def tok(files: ModelFiles) -> Tokenizer:
    return files.tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_digits_are_split_one_by_one(tok: Tokenizer) -> None:
    ids = tok.encode("12345")
    assert len(ids) == 5 and [tok.decode([i]) for i in ids] == list("12345")


def test_control_tokens_are_special(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "user\nhi"  # special tokens skipped by default
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_never_emits_half_a_character(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    detok = tok.detokenizer()
    deltas = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tok.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_push_token_gives_the_same_deltas_as_push(tok: Tokenizer, skip: bool) -> None:
    """push_token's lookup shortcut must not change a single delta: random ids (many of them partial UTF-8, some
    special, some invalid sequences) through both paths."""
    rng = random.Random(7)
    partial = [i for i in range(tok.vocab_size) if not _valid_utf8(tok.token_bytes[i])]
    ids = [rng.choice(partial) if rng.random() < 0.3 else rng.randrange(tok.vocab_size) for _ in range(3000)]
    ids += tok.encode("".join(TEXTS)) + [1, 2]
    slow, fast = tok.detokenizer(skip), tok.detokenizer(skip)
    for i in ids:
        assert fast.push_token(i) == slow.push([i])
    assert fast.flush() == slow.flush()


def test_multibyte_characters_really_are_split_across_tokens(tok: Tokenizer) -> None:
    """The detokenizer test above means something only if some character spans tokens."""
    ids = tok.encode("🚀東京")
    assert any(not _valid_utf8(tok.token_bytes[i]) for i in ids)


def _valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_chat_template_renders_chatml(files: ModelFiles) -> None:
    text = files.chat_template.render([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                     "<|im_start|>assistant\n")


def test_chat_template_is_sandboxed() -> None:
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([{"role": "user", "content": "x"}])
    mutating = ChatTemplate("{% set _ = messages.append({'role': 'x'}) %}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        mutating.render([{"role": "user", "content": "x"}])


def test_template_can_refuse_a_conversation() -> None:
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="user first"):
        strict.render([{"role": "assistant", "content": "x"}])
