"""Token logprobs in OpenAI's two shapes: the completions API's parallel lists and the chat API's objects."""

from __future__ import annotations

import math

from backends.model.tokenizer import Tokenizer
from scheduler.outputs import TokenLogprob
from service.openai.schemas.responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

FLOOR = -9999.0  # OpenAI's stand-in for -inf (JSON has no infinities)


def finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def completion_logprobs(tokenizer: Tokenizer, items: list[TokenLogprob], offset: int,
                        with_top: bool) -> tuple[CompletionLogprobs, int]:
    """The lists for `items`, whose first token starts at `offset` in the choice's text; returns the next
    offset so a stream continues where its last chunk ended."""
    tokens = [tokenizer.token_text(item.token_id) for item in items]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    top = [_top_dict(tokenizer, item) for item in items] if with_top else None
    values = [finite(item.logprob) for item in items]
    return CompletionLogprobs(tokens, values, top, offsets), offset


def _top_dict(tokenizer: Tokenizer, item: TokenLogprob) -> dict[str, float]:
    top = {tokenizer.token_text(t): finite(lp) for t, lp in item.top}
    top.setdefault(tokenizer.token_text(item.token_id), finite(item.logprob))
    return top


def chat_logprobs(tokenizer: Tokenizer, items: list[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs([
        ChatTokenLogprob(tokenizer.token_text(item.token_id), finite(item.logprob),
                         list(tokenizer.token_bytes[item.token_id]), [_top(tokenizer, t, lp) for t, lp in item.top])
        for item in items
    ])


def _top(tokenizer: Tokenizer, token_id: int, logprob: float) -> TopLogprob:
    return TopLogprob(tokenizer.token_text(token_id), finite(logprob), list(tokenizer.token_bytes[token_id]))
