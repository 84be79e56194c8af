"""SentencePiece BPE vocabularies (backends/model/sentencepiece.py) on a vocabulary small enough to follow by
hand: the highest-scoring joined piece merges first, spaces are "▁", unknown characters fall back to bytes, and
control and user-defined pieces are matched as themselves. (The real 262k vocabulary is checked against
transformers' tokenization of the same file in tests/golden.)"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import AddedToken, models
from tokenizers import Tokenizer as FastTokenizer

from backends.model.gguf_file import read_gguf
from backends.model.sentencepiece import NORMAL, merge_ids
from backends.model.token_bytes import TokenBytes
from backends.model.tokenizer import tokenizer_from_metadata
from tests.gemma3 import gemma3_path

CONTROL, USER, BYTE = 3, 4, 6
PIECES = ["<unk>", "<s>", "</s>", "<turn>", "\n\n", "▁", "a", "b", "c", "ab", "bc", "▁a", "▁abc"]
SCORES = [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -0.5, -6.0, -7.0]
TYPES = [2, CONTROL, CONTROL, CONTROL, USER] + [1] * 8


def metadata(add_space_prefix: bool = False) -> dict[str, object]:
    pieces = PIECES + [f"<0x{b:02X}>" for b in range(256)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
            "tokenizer.ggml.scores": SCORES + [0.0] * 256, "tokenizer.ggml.token_type": TYPES + [BYTE] * 256,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_space_prefix": add_space_prefix, "tokenizer.ggml.add_bos_token": True}


def ids(*pieces: str) -> list[int]:
    return [PIECES.index(p) for p in pieces]


def test_merges_rank_joined_pieces_by_score() -> None:
    lefts, rights = merge_ids(PIECES, SCORES, TYPES)
    merges = [(PIECES[a], PIECES[b]) for a, b in zip(lefts.tolist(), rights.tolist(), strict=True)]
    assert merges.index(("b", "c")) < merges.index(("a", "b"))  # "bc" (-0.5) outscores "ab" (-5)
    assert ("▁a", "bc") in merges and ("<tu", "rn>") not in merges


def test_the_best_pair_merges_first() -> None:
    tok = tokenizer_from_metadata(metadata(), "toy")
    assert tok.encode("abc") == ids("a", "bc")  # bc (-0.5) before ab (-5), and "abc" is no piece
    assert tok.encode(" abc") == ids("▁abc")  # bc, then ▁a, then ▁a + bc
    assert tok.encode("ab") == ids("ab")


def test_spaces_controls_user_pieces_and_bytes() -> None:
    tok = tokenizer_from_metadata(metadata(), "toy")
    text = "a<turn>b\n\nz"
    got = tok.encode(text)
    assert got == [*ids("a", "<turn>", "b", "\n\n"), len(PIECES) + ord("z")]  # z: its byte piece
    assert tok.decode(got, skip_special_tokens=False) == text
    assert tok.decode(got) == "ab\n\nz"  # the control piece skipped, the user-defined one kept
    assert tok.encode_prompt("ab") == [1, *ids("ab")] and tok.add_bos


def test_a_space_prefix_where_the_file_asks_for_one() -> None:
    assert tokenizer_from_metadata(metadata(add_space_prefix=True), "toy").encode("abc") == ids("▁abc")


def test_token_bytes_read_as_the_tuple_they_pack() -> None:
    pieces = (b"", b"a", "\u2581\u00e9".encode(), b"\xff", b"", b"longer piece")
    packed = TokenBytes(iter(pieces))
    assert len(packed) == len(pieces) and tuple(packed) == pieces and list(packed[1:4]) == list(pieces[1:4])
    assert [packed[i] for i in range(-len(pieces), len(pieces))] == [*pieces, *pieces]
    for outside in (len(pieces), -len(pieces) - 1):
        with pytest.raises(IndexError):
            packed[outside]
    assert len(TokenBytes([])) == 0


def reference_merges(tokens: list[str], scores: np.ndarray, types: list[int]) -> list[tuple[str, str]]:
    """The merges as the loader made them before they were ids (Python tuples sorted by score, then ids)."""
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


def test_gemma3s_tokenizer_is_the_one_built_from_tuples() -> None:
    """Gemma 3's 262k pieces and 513,511 merges: the model handed to `tokenizers` as ids and packed bytes
    serializes exactly as the one built from Python tuples did (vocabulary, merges in rank order, settings), its
    bytes per id are the same, and sample texts take the same ids."""
    meta = read_gguf(gemma3_path()).metadata
    tok = tokenizer_from_metadata(meta, "gemma3")
    tokens, types = list(meta["tokenizer.ggml.tokens"]), [int(t) for t in meta["tokenizer.ggml.token_type"]]
    scores = np.asarray(meta["tokenizer.ggml.scores"])
    unknown = tokens[int(meta["tokenizer.ggml.unknown_token_id"])]
    reference = FastTokenizer(models.BPE(vocab={p: i for i, p in enumerate(tokens)},
                                         merges=reference_merges(tokens, scores, types), byte_fallback=True,
                                         fuse_unk=True, unk_token=unknown))
    reference.normalizer, reference.decoder = tok.fast.normalizer, tok.fast.decoder
    reference.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, t in enumerate(types) if t == USER])
    reference.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, t in enumerate(types) if t == CONTROL])
    assert tok.fast.to_str() == reference.to_str()
    assert tuple(tok.token_bytes) == tuple(bytes([int(p[3:5], 16)]) if t == BYTE else p.replace("\u2581", " ").encode()
                                           for p, t in zip(tokens, types, strict=True))
    texts = ["The capital of France is", "  def f(x):\n\treturn x ** 2  # \u00e9t\u00e9 \u65e5\u672c\u8a9e \U0001F600",
             "<start_of_turn>user\nHi<end_of_turn>\n<unused7> \x00\x7f\ufffd", " ".join(tokens[1000:3000:7])]
    assert [e.ids for e in tok.fast.encode_batch(texts)] == [e.ids for e in reference.encode_batch(texts)]
