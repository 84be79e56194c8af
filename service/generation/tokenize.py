"""Prompt preparation off the event loop: a big prompt costs its sender, never the other streams.

Small completion prompts (the usual case) are tokenized inline, where a thread hop would cost more than the
work; larger ones, every chat (its template is Python work of any size), big bodies' decoding and grammars go
to a small pool of threads. The tokenizer releases the GIL while it encodes, so those threads run beside the
event loop and the engine. The pool's queue is bounded: past `queue` jobs waiting or running, a request is
refused with 503 and Retry-After instead of queueing more work behind the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.openai.errors import unavailable

T = TypeVar("T")
INLINE_CHARS = 16 * 1024  # below this much text, tokenizing takes well under a millisecond
BUSY_RETRY_S = 1.0  # a full queue empties in about this long: the jobs are tens of milliseconds at most


class PromptEncoder:
    def __init__(self, threads: int, queue: int = 64) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="pagedserve-tokenize")
        self._queue = queue
        self._pending = 0  # jobs submitted and not yet done; only the event loop changes it

    async def run(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), inline when it handles fewer than INLINE_CHARS characters of text, else on the pool."""
        if chars < INLINE_CHARS:
            return fn(*args)
        return await self.off_loop(fn, *args)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the pool, whatever its size (rendering a chat, compiling a grammar: up to tens of ms);
        503 tokenizer_busy when `queue` jobs are already waiting or running."""
        if self._pending >= self._queue:
            raise unavailable(f"the server is preparing {self._pending} prompts; retry shortly", "tokenizer_busy",
                              retry_after=BUSY_RETRY_S)
        loop = asyncio.get_running_loop()
        job = self._pool.submit(fn, *args)
        self._pending += 1  # until the job itself ends, even when its caller has gone
        job.add_done_callback(lambda _: self._ended_on(loop))
        return await asyncio.wrap_future(job)

    def _ended_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the job's thread: count it done on the loop's (the one thread that counts)."""
        try:
            loop.call_soon_threadsafe(self._count_ended)
        except RuntimeError:  # the loop has closed: nobody counts any more
            pass

    def _count_ended(self) -> None:
        self._pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def prompt_chars(prompt: str | list[Any]) -> int:
    """Characters of text a completion prompt holds (token-id prompts hold none)."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str))

