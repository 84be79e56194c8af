"""SentencePiece BPE vocabularies (GGUF's tokenizer model "llama": Llama 2, Gemma, Mistral) as a `tokenizers`
BPE model.

The GGUF file stores such a vocabulary as pieces and scores, no merges: SentencePiece's BPE merges, at each
step, the adjacent pair whose joined piece scores highest. A BPE model does the same when every way of
splitting a piece into two pieces of the vocabulary is a merge, ranked by the joined piece's score (highest
first). Spaces are spelled "▁"; characters outside the vocabulary fall back to their UTF-8 bytes ("<0x41>").
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, normalizers

from backends.model.token_bytes import TokenBytes

SPACE = "\u2581"  # "▁"
NORMAL, BYTE = 1, 6  # llama.cpp's token types: a plain piece; a byte-fallback piece


def merge_ids(tokens: Sequence[str], scores: Sequence[float] | np.ndarray, types: Sequence[int],
              vocab: dict[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (left, right) ids of every split of a plain piece into two pieces of the vocabulary (each piece's id:
    `vocab`), the best-scoring joined pieces first (ties: the lower ids of the halves first). As id arrays, not
    tuples of new strings: Gemma 3 has 513,511 merges."""
    vocab = vocab if vocab is not None else {piece: i for i, piece in enumerate(tokens)}
    left, right, joined = array("i"), array("i"), array("i")
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            a, b = vocab.get(piece[:cut]), vocab.get(piece[cut:])
            if a is not None and b is not None:
                left.append(a)
                right.append(b)
                joined.append(i)
    lefts, rights = np.array(left, np.int32), np.array(right, np.int32)
    best = -np.asarray(scores, np.float64)[np.array(joined, np.intp)]
    order = np.lexsort((rights, lefts, best))  # the last key first: score, then left id, then right id
    return lefts[order], rights[order]


def spm_fast_tokenizer(pieces: Sequence[str], scores: Sequence[float] | np.ndarray, types: Sequence[int] | np.ndarray,
                       add_space_prefix: bool, unknown_id: int | None) -> FastTokenizer:
    fast = FastTokenizer(_bpe(list(pieces), scores, np.asarray(types).tolist(), unknown_id))
    spaces = normalizers.Replace(" ", SPACE)
    fast.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces] if add_space_prefix else [spaces])
    fast.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return fast


def _bpe(tokens: list[str], scores: Sequence[float] | np.ndarray, types: list[int], unknown_id: int | None
         ) -> models.BPE:
    """The BPE model; its temporaries (the vocabulary's dict, the merges) go with this call."""
    _utf8_of_shared_strings()
    vocab = {piece: i for i, piece in enumerate(tokens)}
    return models.BPE(vocab=vocab, merges=_Merges(tokens, *merge_ids(tokens, scores, types, vocab)),
                      byte_fallback=True, fuse_unk=True, unk_token=None if unknown_id is None else tokens[unknown_id])


def _utf8_of_shared_strings() -> None:
    """`tokenizers` reads a str's UTF-8 through CPython's cache on the object, and CPython keeps one str for each
    character U+0080-U+00FF for ever, with that cache once made. Made here, before the vocabulary's temporaries,
    the caches do not hold one of their heap arenas (1 MiB) after they go."""
    models.BPE(vocab={chr(c): c for c in range(0x80, 0x100)}, merges=[])


class _Merges(Sequence[tuple[str, str]]):
    """The merges as `tokenizers` reads them (a sequence of pairs of pieces), each pair made when it is read: a
    list of Gemma 3's 513,511 would be 32 MiB of short-lived objects."""

    def __init__(self, tokens: list[str], lefts: np.ndarray, rights: np.ndarray) -> None:
        self._tokens, self._lefts, self._rights = tokens, array("i", lefts.tobytes()), array("i", rights.tobytes())

    def __len__(self) -> int:
        return len(self._lefts)

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[str, str]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | Sequence[tuple[str, str]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._tokens[self._lefts[index]], self._tokens[self._rights[index]]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((self._tokens[a], self._tokens[b]) for a, b in zip(self._lefts, self._rights, strict=True))


def spm_token_bytes(tokens: Sequence[str], types: Sequence[int] | np.ndarray) -> TokenBytes:
    """Each id's bytes: "▁" is a space, a byte piece "<0xAB>" the byte 0xAB, any other piece its UTF-8."""
    return TokenBytes(bytes([int(piece[3:5], 16)]) if t == BYTE else piece.replace(SPACE, " ").encode("utf-8")
                      for t, piece in zip(np.asarray(types).tolist(), tokens, strict=True))
