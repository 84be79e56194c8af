"""Prompt tokenization off the event loop: a big prompt costs its sender, never the other streams.

Small prompts (the usual case) are tokenized inline, where a thread hop would cost more than the work; larger
ones go to a small pool of threads. The tokenizer releases the GIL while it encodes, so those threads run
beside the event loop and the engine, not in turn with them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.schemas.requests import ChatMessage

T = TypeVar("T")
INLINE_CHARS = 16 * 1024  # below this much text, tokenizing takes well under a millisecond


class PromptEncoder:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="pagedserve-tokenize")

    async def run(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), inline when it handles fewer than INLINE_CHARS characters of text, else on the pool."""
        if chars < INLINE_CHARS:
            return fn(*args)
        return await self.off_loop(fn, *args)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the pool, whatever its size (compiling a grammar: up to tens of ms)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def prompt_chars(prompt: str | list[Any]) -> int:
    """Characters of text a completion prompt holds (token-id prompts hold none)."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str))


def message_chars(messages: list[ChatMessage]) -> int:
    return sum(_content_chars(m.content) for m in messages)


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(part.text or "") for part in content or ())
