"""A lower bound of a chat's rendered length, checked before it is rendered: a conversation that cannot fit the
context whatever its tokens is refused without the template's Python work.

Measured once per template at start-up (`measure`), from the tokens of conversations of empty user and
assistant turns: the fewest special tokens one more turn adds (the markers around a message, `<|im_start|>` and
`<|im_end|>` for SmolLM2) and the fewest runs of plain text between them (SmolLM2's `user\n` and `\n`). A
message's text may merge into those runs' tokens, but a run stays at least one token. And whether the template
renders a message's text as given (no trimming, no dropped reasoning): only then does the text count, at
least its bytes / the longest token's bytes in tokens, since no token spans more bytes. So a conversation has
at least specials + max(runs, text) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backends.model.chat_template import ChatTemplate
from backends.model.tokenizer import Tokenizer
from service.openai.prompts import tokens_at_least, too_long
from service.openai.schemas.requests import ChatMessage

TURN_ROLES = ("user", "assistant")  # the roles `measure` renders
_PROBE = " \n probe: <think>a</think> b \n "  # text a trimming or reasoning-dropping template would change


@dataclass(frozen=True)
class PromptBound:
    specials: int = 0  # special tokens one more user or assistant turn adds, at least
    runs: int = 0  # runs of plain text between them it adds, at least
    counts_text: bool = False  # the template renders messages' text verbatim

    def at_least(self, roles: Sequence[object], text_tokens: int = 0) -> int:
        turns = sum(1 for role in roles if role in TURN_ROLES)
        return self.specials * turns + max(self.runs * turns, text_tokens if self.counts_text else 0)


def measure(template: ChatTemplate, tokenizer: Tokenizer) -> PromptBound:
    """The template's bound; no bound (zeros) for a template that will not render the probes."""
    try:
        counts = [_specials_and_runs(tokenizer, template.render(_turns(count, ""), add_generation_prompt=False))
                  for count in (1, 2, 3)]
        rendered = template.render(_turns(2, _PROBE), add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - any template failure: no bound, not a failed start
        return PromptBound()
    specials, runs = (max(0, min(counts[1][i] - counts[0][i], counts[2][i] - counts[1][i])) for i in (0, 1))
    return PromptBound(specials, runs, rendered.count(_PROBE) == 2)


def check_length(messages: Sequence[ChatMessage], bound: PromptBound, tokenizer: Tokenizer,
                 max_model_len: int) -> None:
    """400 context_length_exceeded for messages that cannot fit the context whatever their tokens."""
    at_least = bound.at_least([m.role for m in messages], tokens_at_least(message_bytes(messages), tokenizer))
    if at_least >= max_model_len:
        raise too_long(at_least, max_model_len, "messages")


def _specials_and_runs(tokenizer: Tokenizer, text: str) -> tuple[int, int]:
    """How many special tokens the text has, and how many runs of other tokens lie between them."""
    special = [token in tokenizer.special_ids for token in tokenizer.encode(text)]
    runs = sum(1 for i, is_special in enumerate(special) if not is_special and (i == 0 or special[i - 1]))
    return sum(special), runs


def _turns(count: int, content: str) -> list[dict[str, str]]:
    return [{"role": TURN_ROLES[i % 2], "content": content} for i in range(count)]


def message_bytes(messages: Sequence[ChatMessage]) -> int:
    """UTF-8 bytes of the messages' text (a lone surrogate counted as its three bytes)."""
    return sum(len(text.encode("utf-8", errors="surrogatepass")) for m in messages for text in _texts(m.content))


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [part.text or "" for part in content or ()]
