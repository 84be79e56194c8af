"""SentencePiece BPE vocabularies (backends/model/sentencepiece.py) on a vocabulary small enough to follow by
hand: the highest-scoring joined piece merges first, spaces are "▁", unknown characters fall back to bytes, and
control and user-defined pieces are matched as themselves. (The real 262k vocabulary is checked against
transformers' tokenization of the same file in tests/golden.)"""

from __future__ import annotations

from backends.model.sentencepiece import merges_from_scores
from backends.model.tokenizer import tokenizer_from_metadata

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
    merges = merges_from_scores(PIECES, SCORES, TYPES)
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
