"""The tokenizer built from GGUF metadata with the `tokenizers` library (byte-level BPE, "gpt2"; SentencePiece
BPE, "llama": sentencepiece.py), and its incremental detokenizer."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from backends.model.config import ModelLoadError
from backends.model.sentencepiece import spm_fast_tokenizer, spm_token_bytes
from backends.model.token_bytes import TokenBytes

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
USER_DEFINED_TOKEN_TYPE = 4  # matched in text as themselves (Gemma's runs of spaces and newlines), not special
# Pre-tokenizers whose regex is GPT-2's after splitting every digit on its own (StarCoder-style vocabularies).
_DIGIT_SPLITTING = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva"}
_GPT2_STYLE = {"gpt2", "default", "olmo", "jais", "poro-chat", "viking", "gpt-2"}
# Llama 3's and Qwen2's splits as llama.cpp runs them (src/llama-vocab.cpp): Hugging Face's regexes with the
# contractions' (?i:...) spelled out, so that "'ſt" stays one word as in llama.cpp ((?i:'s) folds ſ to s).
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}", 1)  # one digit a word
# The names llama.cpp reads as each split. Its Llama 3 group also takes a word the vocabulary holds whole, without
# merging (ignore_merges, as Llama 3's tokenizer.json has it), and adds BOS unless the file says otherwise.
_LLAMA3_STYLE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                 "jina-v5-nano"}
_QWEN2_STYLE = {"qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan"}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what byte-level vocabularies are spelled in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@dataclass(frozen=True)
class Tokenizer:
    fast: FastTokenizer
    token_bytes: Sequence[bytes]  # each id's raw bytes (control tokens: their text), packed (TokenBytes)
    special_ids: frozenset[int]
    bos_token_id: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int = field(default=0)
    add_bos: bool = False  # a text prompt starts with BOS (tokenizer.ggml.add_bos_token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for `text`; control-token spellings in the text become their special ids. Through
        encode_batch, which releases the GIL (encode holds it: a megabyte of text would freeze every other
        thread for a second), at the same cost for one text. add_special_tokens: also the tokens the
        tokenizer's post-processor adds (a BOS, say); tokenizers built from GGUF metadata have none."""
        return list(self.fast.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt's ids: BOS first where the model asks for it (a chat template writes its own)."""
        ids = self.encode(text)
        return [self.bos_token_id, *ids] if self.add_bos else ids

    @cached_property
    def max_token_bytes(self) -> int:
        """The longest token's bytes: a text of B bytes has at least B / max_token_bytes tokens."""
        return max((len(b) for b in self.token_bytes), default=1)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.bytes_of(ids, skip_special_tokens)).decode("utf-8", errors="replace")

    def bytes_of(self, ids: Iterable[int], skip_special_tokens: bool = True) -> list[bytes]:
        return [
            self.token_bytes[i] for i in ids if not (skip_special_tokens and i in self.special_ids)
        ]

    def token_text(self, token_id: int) -> str:
        """One token's text for logprobs displays (may be a partial UTF-8 character, shown replaced)."""
        return self.token_bytes[token_id].decode("utf-8", errors="replace")

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)

    def whole_texts(self, skip_special_tokens: bool = True) -> tuple[str | None, ...]:
        """Each id's text when its bytes are complete UTF-8 by themselves (most tokens), else None."""
        return self._whole_texts_skip if skip_special_tokens else self._whole_texts_keep

    @cached_property
    def _whole_texts_skip(self) -> tuple[str | None, ...]:
        return tuple("" if i in self.special_ids else _whole(b) for i, b in enumerate(self.token_bytes))

    @cached_property
    def _whole_texts_keep(self) -> tuple[str | None, ...]:
        return tuple(_whole(b) for b in self.token_bytes)


def _whole(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class IncrementalDetokenizer:
    """Turns a growing token stream into text deltas; a multi-byte character split across tokens is held back
    until complete, so deltas never carry half a character and their concatenation equals `decode`."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._whole = tokenizer.whole_texts(skip_special_tokens)
        self._clean = True  # the decoder holds no partial character

    def push(self, ids: Sequence[int]) -> str:
        text = self._utf8.decode(b"".join(self._tokenizer.bytes_of(ids, self._skip)))
        self._clean = not self._utf8.getstate()[0]
        return text

    def push_token(self, token_id: int) -> str:
        # With no partial character pending, a token that is whole UTF-8 decodes to its own text: a lookup.
        if self._clean:
            text = self._whole[token_id]
            if text is not None:
                return text
        return self.push((token_id,))

    def flush(self) -> str:
        """Whatever is held back at the end (an incomplete character becomes U+FFFD, as in `decode`)."""
        self._clean = True
        return self._utf8.decode(b"", final=True)


def tokenizer_from_metadata(meta: dict[str, Any], source: str) -> Tokenizer:
    """The tokenizer of a GGUF file's metadata. Its big temporaries (the pieces as str objects, the vocabulary's
    dict, the merges) live only while the `tokenizers` model is built and nothing that stays is made meanwhile:
    what stays would keep their heap arenas resident (Gemma 3: 5 MiB)."""
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ModelLoadError(f"{source}: tokenizer model '{model}' is not supported (BPE: 'gpt2' or 'llama')")
    pieces: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(pieces))), np.int64)
    pre = str(meta.get("tokenizer.ggml.pre"))
    if model == "gpt2":
        token_bytes = byte_level_token_bytes(pieces, types)
        fast = _build_fast(pieces, meta.get("tokenizer.ggml.merges", []), pre)
    else:
        token_bytes = spm_token_bytes(pieces, types)
        unknown = meta.get("tokenizer.ggml.unknown_token_id")
        fast = spm_fast_tokenizer(pieces, np.asarray(meta.get("tokenizer.ggml.scores", np.zeros(len(pieces)))),
                                  types, bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                                  None if unknown is None else int(unknown))
    special = np.flatnonzero(types == CONTROL_TOKEN_TYPE).tolist()
    fast.add_tokens([AddedToken(pieces[i], special=False, normalized=False)
                     for i in np.flatnonzero(types == USER_DEFINED_TOKEN_TYPE).tolist()])
    fast.add_special_tokens([AddedToken(pieces[i], special=True, normalized=False) for i in special])
    eos = [int(meta.get("tokenizer.ggml.eos_token_id", 2))]
    if "tokenizer.ggml.eot_token_id" in meta:  # an end-of-turn token the file names: a stop too
        eos.append(int(meta["tokenizer.ggml.eot_token_id"]))
    return Tokenizer(
        fast=fast,
        token_bytes=token_bytes,
        special_ids=frozenset(special),
        bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        eos_token_ids=tuple(dict.fromkeys(eos)),
        vocab_size=len(pieces),
        # llama.cpp's defaults: BOS for SentencePiece and the Llama 3 group
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama" or pre in _LLAMA3_STYLE)),
    )


def _build_fast(pieces: Sequence[str], merges: Sequence[str], pre: str) -> FastTokenizer:
    fast = FastTokenizer(_bpe(list(pieces), merges, ignore_merges=pre in _LLAMA3_STYLE))
    fast.pre_tokenizer = _pre_tokenizer(pre)
    fast.decoder = decoders.ByteLevel()
    return fast


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The split llama.cpp makes for the file's `tokenizer.ggml.pre`, then GPT-2's bytes-to-characters map."""
    if pre in _LLAMA3_STYLE or pre in _QWEN2_STYLE:  # as Llama 3's and Qwen2's tokenizer.json write them
        split = _LLAMA3_SPLIT if pre in _LLAMA3_STYLE else _QWEN2_SPLIT
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLITTING:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2_STYLE or pre == "None":
        return byte_level
    raise ModelLoadError(f"pre-tokenizer '{pre}' is not supported")


def _bpe(tokens: list[str], merges: Sequence[str], ignore_merges: bool = False) -> models.BPE:
    """Byte-level BPE from the file's merges; its temporaries go with this call."""
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    return models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=pairs,  # type: ignore[arg-type]
                      ignore_merges=ignore_merges)


def byte_level_token_bytes(tokens: Sequence[str], types: np.ndarray) -> TokenBytes:
    to_byte = {ch: b for b, ch in bytes_to_unicode().items()}

    def spelled(control: bool, tok: str) -> bytes:
        if control or any(ch not in to_byte for ch in tok):
            return tok.encode("utf-8")  # control tokens (and any odd entry) are spelled literally
        return bytes(to_byte[ch] for ch in tok)

    return TokenBytes(spelled(t == CONTROL_TOKEN_TYPE, tok) for t, tok in zip(types.tolist(), tokens, strict=True))
