"""Llama 3's and Qwen2's pre-tokenizers (tokenizer.ggml.pre "llama-bpe", "qwen2" and the names llama.cpp reads
as the same): pagedserve's tokenizer of small byte-level BPE GGUF files gives the ids transformers gives for
varied texts (tests/golden/pretokenizers/make_reference.py wrote the files and reference.json)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from backends.model.config import ModelLoadError
from backends.model.gguf_file import read_gguf
from backends.model.tokenizer import Tokenizer, bytes_to_unicode, tokenizer_from_metadata

HERE = Path(__file__).parent / "pretokenizers"
REFERENCE = json.loads((HERE / "reference.json").read_text())
# What llama.cpp's src/llama-vocab.cpp reads as LLAMA_VOCAB_PRE_TYPE_LLAMA3 (ignore_merges, BOS by default) and as
# Qwen2's regex (QWEN2, STABLELM2 and HUNYUAN share it; their other flags only touch detokenizing).
ALIASES = {
    "llama-bpe": ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                  "jina-v5-nano"],
    "qwen2": ["qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan"],
}


def metadata(name: str) -> dict[str, Any]:
    entry = REFERENCE["files"][name]
    path = HERE / entry["gguf"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    return read_gguf(path).metadata


def tokenizer(name: str, pre: str | None = None) -> Tokenizer:
    meta = metadata(name)
    return tokenizer_from_metadata({**meta, "tokenizer.ggml.pre": pre or meta["tokenizer.ggml.pre"]}, name)


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_ids_equal_transformers_for_every_text(name: str) -> None:
    tok = tokenizer(name)
    cases = REFERENCE["files"][name]["cases"]
    assert len(cases) >= 20 and tok.vocab_size == REFERENCE["files"][name]["vocab_size"]
    for case in cases:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"], skip_special_tokens=False) == case["text"]


@pytest.mark.parametrize(("name", "pre"), [(name, pre) for name, names in ALIASES.items() for pre in names])
def test_llama_cpp_aliases_split_alike(name: str, pre: str) -> None:
    tok = tokenizer(name, pre)
    assert [tok.encode(c["text"]) for c in REFERENCE["files"][name]["cases"]] == [
        c["ids"] for c in REFERENCE["files"][name]["cases"]]
    assert tok.add_bos == (name == "llama-bpe")  # llama.cpp's default where the file does not say


def test_ignore_merges_only_in_the_llama3_group() -> None:
    """The witness word is a whole token no merge reaches: Llama 3's group takes it whole, Qwen2's merges."""
    witness = REFERENCE["witness"]
    llama, qwen = tokenizer("llama-bpe"), tokenizer("qwen2")
    assert len(llama.encode(witness)) == 1 and len(qwen.encode(witness)) > 1
    merged = {c["text"]: c["ids"] for c in REFERENCE["files"]["llama-bpe"]["transformers_as_loaded"]}
    assert llama.encode(witness) != merged[witness]  # what transformers' GGUF tokenizer gives as it loads


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_contractions_are_llama_cpps_not_case_folded(name: str) -> None:
    """llama.cpp spells (?i:'s) as '[sS]: the long s (ſ, which folds to s) starts no contraction."""
    words = words_of(tokenizer(name), "x'ſt it'S we'LL")
    assert words == ["x", "'ſt", " it", "'S", " we", "'LL"]


def test_numbers_split_by_three_or_by_one() -> None:
    assert words_of(tokenizer("llama-bpe"), "1234567") == ["123", "456", "7"]
    assert words_of(tokenizer("qwen2"), "1234") == ["1", "2", "3", "4"]


def words_of(tok: Tokenizer, text: str) -> list[str]:
    """The pre-tokenizer's words as text (it spells them in GPT-2's byte alphabet)."""
    to_byte = {ch: b for b, ch in bytes_to_unicode().items()}
    words = tok.fast.pre_tokenizer.pre_tokenize_str(text)
    return [bytes(to_byte[ch] for ch in word).decode("utf-8") for word, _ in words]


def test_a_pre_tokenizer_not_read_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="pre-tokenizer 'deepseek-llm' is not supported"):
        tokenizer("qwen2", "deepseek-llm")
