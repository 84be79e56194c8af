"""Stop strings found across token boundaries, without emitting any part of them."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.stop import TextAssembler


class PieceDetokenizer:
    """Each 'token id' i decodes to pieces[i]."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def push(self, ids: Sequence[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def flush(self) -> str:
        return ""


def run(pieces: list[str], stop: tuple[str, ...]) -> tuple[str, str | None]:
    text = TextAssembler(PieceDetokenizer(pieces), stop)
    out = ""
    for i in range(len(pieces)):
        delta, hit = text.push([i])
        out += delta
        if hit is not None:
            return out, hit
    return out + text.finish(), None


def test_stop_string_split_across_three_tokens() -> None:
    assert run(["Hel", "lo wo", "rld", "!"], ("o world",)) == ("Hell", "o world")


def test_earliest_of_several_stop_strings_wins() -> None:
    assert run(["ab", "cd", "ef"], ("de", "bc")) == ("a", "bc")


def test_no_stop_emits_everything_in_order() -> None:
    assert run(["one ", "two ", "three"], ("four",)) == ("one two three", None)


def test_held_back_text_is_released_once_it_cannot_start_a_stop() -> None:
    text = TextAssembler(PieceDetokenizer(["abc", "xyz"]), ("cx!",))
    assert text.push([0]) == ("a", None)  # "bc" might begin "cx!"
    assert text.push([1]) == ("bcx", None)
    assert text.finish() == "yz"


def test_stop_string_kept_when_asked() -> None:
    text = TextAssembler(PieceDetokenizer(["Hel", "lo wo", "rld", "!"]), ("o world",), include_stop=True)
    out = ""
    for i in range(4):
        delta, hit = text.push([i])
        out += delta
        if hit is not None:
            break
    assert (out, hit) == ("Hello world", "o world")
