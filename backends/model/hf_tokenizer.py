"""A Hugging Face checkpoint's tokenizer and chat template: `tokenizer.json` through `tokenizers` as it is (its
normalizer, pre-tokenizer and model), the special tokens and template from `tokenizer_config.json` or
`chat_template.jinja`, the stop tokens from `generation_config.json` too (its EOS may be a list)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as FastTokenizer

from backends.model.config import ModelLoadError
from backends.model.sentencepiece import BYTE, NORMAL, spm_token_bytes
from backends.model.tokenizer import CONTROL_TOKEN_TYPE, Tokenizer, byte_level_token_bytes

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
TEMPLATE = "chat_template.jinja"  # where transformers 5 writes the template


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON object file; {} for an optional one that is absent."""
    if not path.is_file():
        if required:
            raise ModelLoadError(f"{path.parent}: {path.name} is missing")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path}: not a JSON object")
    return value


def tokenizer_from_directory(directory: Path, config: dict[str, Any]) -> Tokenizer:
    """The checkpoint's tokenizer, its ids covering the model's `vocab_size` (config.json)."""
    path = directory / TOKENIZER
    if not path.is_file():
        raise ModelLoadError(f"{directory}: {TOKENIZER} is missing (only fast tokenizers are read)")
    try:
        text = path.read_text(encoding="utf-8")
        fast = FastTokenizer.from_str(text)
        decoder = json.loads(text).get("decoder") or {}
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot read
        raise ModelLoadError(f"{path}: {exc}") from None
    settings = read_json(directory / TOKENIZER_CONFIG, required=False)
    tokens = _tokens(fast, int(config.get("vocab_size", 0)))
    special = frozenset(i for i, t in fast.get_added_tokens_decoder().items() if t.special)
    bos = _token_id(fast, settings.get("bos_token"), config.get("bos_token_id"))
    return Tokenizer(fast=fast, token_bytes=_bytes_of(path, decoder, tokens, special), special_ids=special,
                     bos_token_id=-1 if bos is None else bos, eos_token_ids=_eos_ids(directory, fast, settings, config),
                     vocab_size=len(tokens), add_bos=_adds_bos(fast, settings, bos))


def _tokens(fast: FastTokenizer, vocab_size: int) -> list[str]:
    """Each id's piece; "" for ids past the tokenizer's (a model's vocabulary is often padded)."""
    vocab = fast.get_vocab(with_added_tokens=True)
    tokens = [""] * max(vocab_size, max(vocab.values(), default=-1) + 1)
    for piece, i in vocab.items():
        tokens[i] = piece
    return tokens


def _bytes_of(path: Path, decoder: dict[str, Any], tokens: list[str], special: frozenset[int]) -> Sequence[bytes]:
    """Byte-level vocabularies (GPT-2's alphabet: Llama 3, Qwen, SmolLM2) or SentencePiece ones ("▁" for spaces,
    "<0xAB>" byte pieces: Llama 2, Mistral), told apart by the decoder tokenizer.json names; spelled as the GGUF
    path spells them, from the same token types."""
    types = np.array([CONTROL_TOKEN_TYPE if i in special else BYTE if _is_byte_piece(t) else NORMAL
                      for i, t in enumerate(tokens)])
    if _names(decoder, "ByteLevel"):
        return byte_level_token_bytes(tokens, types)
    if _names(decoder, "ByteFallback") or _names(decoder, "Metaspace") or _names(decoder, "Replace"):
        return spm_token_bytes(tokens, types)
    raise ModelLoadError(f"{path}: decoder {decoder.get('type')!r} is not supported (ByteLevel or SentencePiece)")


def _names(decoder: dict[str, Any], kind: str) -> bool:
    """Whether the decoder is `kind` or a Sequence holding one."""
    return decoder.get("type") == kind or any(_names(d, kind) for d in decoder.get("decoders") or ())


def _is_byte_piece(piece: str) -> bool:
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


def _token_id(fast: FastTokenizer, token: Any, fallback: Any) -> int | None:
    """A special token named as tokenizer_config.json names it (a string or {"content": ...}), else the id."""
    text = token.get("content") if isinstance(token, dict) else token
    found = fast.token_to_id(text) if isinstance(text, str) else None
    if found is not None:
        return int(found)
    return int(fallback) if isinstance(fallback, int) else None


def _eos_ids(directory: Path, fast: FastTokenizer, settings: dict[str, Any], config: dict[str, Any]
             ) -> tuple[int, ...]:
    """generation_config.json's EOS (an id or a list: Llama 3's end of text and end of turn), then the
    tokenizer's and config.json's."""
    generation = read_json(directory / GENERATION_CONFIG, required=False).get("eos_token_id")
    ids = list(generation) if isinstance(generation, list) else [generation]
    ids += [_token_id(fast, settings.get("eos_token"), None), config.get("eos_token_id")]
    found = tuple(dict.fromkeys(int(i) for i in ids if isinstance(i, int)))
    if not found:
        raise ModelLoadError(f"{directory}: no EOS token in {GENERATION_CONFIG}, {TOKENIZER_CONFIG} or config.json")
    return found


def _adds_bos(fast: FastTokenizer, settings: dict[str, Any], bos: int | None) -> bool:
    """tokenizer_config.json's add_bos_token where it says; else whether tokenizer.json's post-processor puts
    BOS first (Llama 3's does)."""
    if isinstance(settings.get("add_bos_token"), bool):
        return bool(settings["add_bos_token"]) and bos is not None
    return bos is not None and fast.encode("a", add_special_tokens=True).ids[:1] == [bos]


def chat_template_text(directory: Path) -> str | None:
    """chat_template.jinja, else tokenizer_config.json's chat_template (a string, or named templates: the
    "default" one); None when the checkpoint has none."""
    if (directory / TEMPLATE).is_file():
        return (directory / TEMPLATE).read_text(encoding="utf-8")
    template = read_json(directory / TOKENIZER_CONFIG, required=False).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None
