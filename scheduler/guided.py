"""Constrained decoding with llguidance: a request's grammar, one matcher per sequence, a token mask per step.

A request's constraint (a JSON schema, a regular expression, a list of choices, a Lark grammar) is compiled
once, when the service reads the request, into a `GuideSpec` (llguidance's grammar text); a bad one is an
InvalidRequestError there, before anything is queued. Each sequence of the request gets its own `Guide` (an
`LLMatcher` over the model's tokenizer) that follows the tokens it samples.

Per step, the masks of the sampled sequences that have a guide are computed on the factory's mask thread while
the backend runs the forward pass (llguidance releases the GIL); sampling waits for them only when it needs
them (`AllowedTokens.bits`). Steps without a guided sequence build nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from backends.base import IntArray
from scheduler.errors import GrammarError, InvalidRequestError
from scheduler.guide_errors import NAMES, Kind, described

GuideKind = Kind
# Compact but readable JSON ("a": 1, "b": 2): with free whitespace a small model can fill its budget with blank
# lines that the grammar allows.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_SPEC_CHARS = 64 * 1024  # a grammar bigger than this is refused before compiling


def parser_limits() -> llguidance.LLParserLimits:
    """Tighter than llguidance's defaults, so that no grammar costs a step more than a few tens of ms (a
    pathological regex's first mask: 0.8 s by default, 42 ms with these); errors name no grammar text."""
    return llguidance.LLParserLimits(initial_lexer_fuel=100_000, step_lexer_fuel=100_000,
                                     max_lexer_states=50_000, verbose_errors=False)


class GuideTokenizer(Protocol):
    """What llguidance needs of the model's tokenizer (backends.model.tokenizer.Tokenizer fits)."""

    @property
    def token_bytes(self) -> Seq[bytes]: ...

    @property
    def special_ids(self) -> frozenset[int]: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def bos_token_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class GuideSpec:
    """A compiled constraint: llguidance's grammar text, and what the client asked for (for logs and errors)."""

    grammar: str
    kind: GuideKind


class _Wrapped:
    """The tokenizer in the shape llguidance's TokenizerWrapper reads (tokens as raw bytes)."""

    def __init__(self, tokenizer: GuideTokenizer) -> None:
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = list(tokenizer.token_bytes)
        self.special_token_ids = sorted(tokenizer.special_ids)
        self._encode = tokenizer.encode

    def __call__(self, text: str | bytes) -> list[int]:
        return self._encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)


class GuideFactory:
    """llguidance over one tokenizer (built once: 0.1 s for SmolLM2's 49k tokens, 1.5 s for Gemma 3's 262k), the
    compiler of specs and maker of guides."""

    def __init__(self, tokenizer: GuideTokenizer, mask_threads: int = 1) -> None:
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped(tokenizer)))
        self.vocab_size = self.tokenizer.vocab_size
        # llguidance knows one EOS (the first); the model's other stops (Gemma's <end_of_turn> beside <eos>) end a
        # grammar as it does: allowed wherever it is, and followed as it.
        self.eos = tokenizer.eos_token_ids[0]
        self.other_stops = frozenset(tokenizer.eos_token_ids[1:]) - {self.eos}
        self.limits = parser_limits()
        self.writable = writable_bytes(tokenizer)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pagedserve-masks")
        self._executor = llguidance.LLExecutor(mask_threads)

    def compile(self, kind: GuideKind, value: Any, param: str) -> GuideSpec:
        """The spec of a constraint given as JSON schema (dict), regex (str), choices (list of str) or Lark
        grammar (str); raises GrammarError naming `param` when llguidance cannot compile it."""
        if kind == "choice":
            self._check_writable(value, param)
        grammar = _grammar(kind, value, param)
        error: str | None = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer, limits=self.limits)
        if not error:  # the first mask and token too: some limits are only met there
            error = self._first_step_error(grammar)
        if error:
            raise grammar_error(error, kind, param)
        return GuideSpec(grammar, kind)

    def _check_writable(self, choices: Any, param: str) -> None:
        """A choice holding a byte no token holds (SmolLM2 has none for a few control characters, nor for the
        lead bytes of planes 4-11) can never be written: the grammar would fail mid-answer, so it is refused."""
        for index, choice in enumerate(choices if isinstance(choices, list) else ()):
            if not isinstance(choice, str):
                continue
            unwritable = next((char for char in choice if not self.writable.issuperset(_utf8(char))), None)
            if unwritable is not None:
                raise GrammarError(f"{param}: choice {index} holds a character this model cannot write "
                                   f"(U+{ord(unwritable):04X})", param, f"no token holds {_utf8(unwritable)!r}")

    def _first_step_error(self, grammar: str) -> str | None:
        """The first mask's error, or the first allowed token's: a schema that requires itself (no finite
        value) passes the mask and explodes on the first token, which would fail the request mid-answer."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.limits)
        bits = llg_numpy.allocate_token_bitmask(1, self.vocab_size)
        llg_numpy.fill_next_token_bitmask(matcher, bits)
        words = bits[0].view(np.uint32)
        allowed = np.flatnonzero(words)
        if not matcher.is_error() and allowed.size:
            word = int(words[allowed[0]])
            matcher.consume_token(int(allowed[0]) * 32 + (word & -word).bit_length() - 1)  # the lowest allowed id
        return matcher.get_error() if matcher.is_error() else None

    def guide(self, spec: GuideSpec) -> Guide:
        return Guide(llguidance.LLMatcher(self.tokenizer, spec.grammar, log_level=0, limits=self.limits), self,
                     spec.kind)

    def masks(self, guides: Seq[Guide], positions: IntArray) -> PendingMasks:
        """Start computing the masks of `guides` (sampled at `positions`); the result is awaited by sampling."""
        bits = llg_numpy.allocate_token_bitmask(len(guides), self.vocab_size)
        pairs = [(g.matcher, i) for i, g in enumerate(guides)]
        future = self._pool.submit(self._fill, pairs, bits)
        return PendingMasks(positions, bits, future)

    def _fill(self, pairs: list[tuple[llguidance.LLMatcher, int]], bits: np.ndarray) -> None:
        llg_numpy.fill_next_token_bitmask_par(self._executor, pairs, bits)
        if self.other_stops:
            allow_alike(bits, self.eos, self.other_stops)

    def grammar_token(self, token: int) -> int:
        """The token as llguidance knows it: any stop is its EOS."""
        return self.eos if token in self.other_stops else token

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def allow_alike(bits: np.ndarray, token: int, others: Iterable[int]) -> None:
    """Allow each of `others` in the rows of `bits` (int32 bitmasks, bit j of word w is token 32 * w + j) that
    allow `token`."""
    words = bits.view(np.uint32)
    on = (words[:, token >> 5] >> np.uint32(token & 31)) & np.uint32(1)
    for other in others:
        words[:, other >> 5] |= on << np.uint32(other & 31)


def writable_bytes(tokenizer: GuideTokenizer) -> frozenset[int]:
    """The bytes some ordinary token holds."""
    pieces = tokenizer.token_bytes
    special = tokenizer.special_ids
    joined = b"".join(pieces[i] for i in range(len(pieces)) if i not in special)
    return frozenset(np.unique(np.frombuffer(joined, np.uint8)).tolist())


def _utf8(char: str) -> bytes:
    return char.encode("utf-8", errors="surrogatepass")


def grammar_error(text: str, kind: GuideKind, param: str) -> GrammarError:
    """The client's 400 for the engine's error `text`: our words, its text kept for the log."""
    return GrammarError(f"{param}: the {NAMES[kind]} {described(text, kind)}", param, text.strip())


def _grammar(kind: GuideKind, value: Any, param: str) -> str:
    try:
        return _grammar_text(kind, value, param)
    except InvalidRequestError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:  # llguidance's own refusals (an integer past 64 bits)
        raise grammar_error(str(exc), kind, param) from None


def _grammar_text(kind: GuideKind, value: Any, param: str) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequestError(f"{param}: the {NAMES[kind]} is longer than {MAX_SPEC_CHARS} characters", param)
    if kind == "json_schema":
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{param}: a JSON schema must be an object", param)
        return llguidance.LLMatcher.grammar_from_json_schema(value, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(_string(value, param))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError(f"{param}: choices must be a non-empty list of non-empty strings", param)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    return llguidance.LLMatcher.grammar_from_lark(_string(value, param))


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param)
    return value


class Guide:
    """One sequence's place in its grammar. Touched by one thread at a time: the mask thread during a step,
    the engine's thread after it (Scheduler.update waits for the step's masks before consuming)."""

    def __init__(self, matcher: llguidance.LLMatcher, factory: GuideFactory, kind: GuideKind = "lark") -> None:
        self.matcher = matcher
        self.factory = factory
        self.kind = kind

    def consume(self, token: int) -> bool:
        """Follow a sampled token; True when the grammar is done (or broken) and the sequence must stop."""
        self.matcher.consume_token(self.factory.grammar_token(token))
        return bool(self.matcher.is_stopped() or self.matcher.is_error())

    def allowed_run(self, tokens: Seq[int]) -> int:
        """How many of `tokens`, in order from the first, the grammar accepts from here (state unchanged)."""
        return int(self.matcher.validate_tokens([self.factory.grammar_token(t) for t in tokens]))

    def after(self, tokens: Seq[int]) -> Guide:
        """A copy of this place in the grammar, moved on by `tokens` (which it must accept): the place a guessed
        position's mask is computed at."""
        copy = self.matcher.deep_copy()
        copy.consume_tokens([self.factory.grammar_token(t) for t in tokens])
        return Guide(copy, self.factory, self.kind)

    @property
    def error(self) -> str | None:
        """Why the grammar broke, in our words (the engine's text: `detail`); None while it holds."""
        if not self.matcher.is_error():
            return None
        return f"the {NAMES[self.kind]} {described(self.detail, self.kind, 'follow')}"

    @property
    def detail(self) -> str:
        return self.matcher.get_error().strip()


class PendingMasks:
    """The allowed tokens of the guided rows of one step (backends.base.AllowedTokens), being computed."""

    def __init__(self, positions: IntArray, bits: np.ndarray, future: Future[None]) -> None:
        self.positions = positions
        self._bits = bits
        self._future = future

    def bits(self) -> np.ndarray:
        self._future.result()
        return self._bits

    def wait(self) -> None:
        """Block until the mask thread is done with the guides (so the engine may move them on)."""
        self._future.exception()
