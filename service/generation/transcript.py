"""Logging of prompts and outputs, only when `log_prompts` is on: a Formatter wrapper that records each
choice's text on its way out and logs the exchange when the request ends."""

from __future__ import annotations

import logging
from typing import Any

from backends.model.tokenizer import Tokenizer
from scheduler.outputs import ChoiceDelta
from service.openai.formats import Formatter
from service.openai.prompts import TokenIds
from service.openai.schemas.responses import Usage

log = logging.getLogger("service.transcript")


class Transcript:
    def __init__(self, inner: Formatter, request_id: str, prompts: list[TokenIds], tokenizer: Tokenizer) -> None:
        self._inner = inner
        self._id = request_id
        self._prompts = [tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        self._texts: dict[int, str] = {}

    def preamble(self, num_choices: int, usage: Usage | None = None) -> bytes:
        return self._inner.preamble(num_choices, usage)

    def chunk(self, index: int, delta: ChoiceDelta, usage: Usage | None = None) -> bytes:
        self._texts[index] = self._texts.get(index, "") + delta.text
        return self._inner.chunk(index, delta, usage)

    def usage_chunk(self, usage: Usage) -> bytes:
        return self._inner.usage_chunk(usage)

    def response(self, choices: list[ChoiceDelta], usage: Usage) -> Any:
        self._texts = {i: c.text for i, c in enumerate(choices)}
        return self._inner.response(choices, usage)

    def log(self) -> None:
        log.info("%s prompts=%r outputs=%r", self._id, self._prompts, [self._texts[i] for i in sorted(self._texts)])
