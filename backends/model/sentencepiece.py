"""SentencePiece BPE vocabularies (GGUF's tokenizer model "llama": Llama 2, Gemma, Mistral) as a `tokenizers`
BPE model.

The GGUF file stores such a vocabulary as pieces and scores, no merges: SentencePiece's BPE merges, at each
step, the adjacent pair whose joined piece scores highest. A BPE model does the same when every way of
splitting a piece into two pieces of the vocabulary is a merge, ranked by the joined piece's score (highest
first). Spaces are spelled "▁"; characters outside the vocabulary fall back to their UTF-8 bytes ("<0x41>").
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, normalizers

SPACE = "\u2581"  # "▁"
NORMAL, BYTE = 1, 6  # llama.cpp's token types: a plain piece; a byte-fallback piece


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]
                       ) -> list[tuple[str, str]]:
    """Every split of a plain piece into two pieces of the vocabulary, the best-scoring joined pieces first
    (ties: the lower ids of the halves first)."""
    vocab = {piece: i for i, piece in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_fast_tokenizer(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                       add_space_prefix: bool, unknown_id: int | None) -> FastTokenizer:
    vocab = {piece: i for i, piece in enumerate(tokens)}
    unknown = tokens[unknown_id] if unknown_id is not None else None
    model = models.BPE(vocab=vocab, merges=merges_from_scores(tokens, scores, types), byte_fallback=True,
                       fuse_unk=True, unk_token=unknown)
    fast = FastTokenizer(model)
    spaces = normalizers.Replace(" ", SPACE)
    fast.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces] if add_space_prefix else [spaces])
    fast.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return fast


def spm_token_bytes(tokens: Sequence[str], types: Sequence[int]) -> tuple[bytes, ...]:
    """Each id's bytes: "▁" is a space, a byte piece "<0xAB>" the byte 0xAB, any other piece its UTF-8."""
    return tuple(bytes([int(piece[3:5], 16)]) if types[i] == BYTE else piece.replace(SPACE, " ").encode("utf-8")
                 for i, piece in enumerate(tokens))
