"""What the load generator sends, where, and at what pace."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class Target:
    """The server under test."""

    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "completions"  # completions | chat
    model: str | None = None  # the request's "model"; None: omitted (a single-model server picks its own)
    api_key: str | None = None
    timeout_s: float = 600.0  # per request, headers to [DONE]
    session_header: str | None = None  # a header carrying one id per session (all turns of a chat share it)

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, not {self.endpoint!r}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ENDPOINTS[self.endpoint]

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


@dataclass(frozen=True)
class RequestSpec:
    """One request. `messages` is the conversation (chat); `prompt` its text form (completions)."""

    prompt: str = ""
    messages: tuple[Message, ...] = ()
    max_tokens: int = 128
    ignore_eos: bool = True
    temperature: float | None = None  # None: omitted, so the server samples at its default (OpenAI's: 1.0)

    def chat_messages(self) -> tuple[Message, ...]:
        return self.messages or (("user", self.prompt),)

    def completion_prompt(self) -> str:
        if self.prompt or not self.messages:
            return self.prompt
        return "\n\n".join(f"{role}: {content}" for role, content in self.messages) + "\n\nassistant:"


class Session(Protocol):
    """A chain of requests where each may depend on the last answer (one request for most workloads)."""

    def first(self) -> RequestSpec: ...

    def follow(self, spec: RequestSpec, answer: str) -> RequestSpec | None: ...


@dataclass(frozen=True)
class Single:
    spec: RequestSpec

    def first(self) -> RequestSpec:
        return self.spec

    def follow(self, spec: RequestSpec, answer: str) -> RequestSpec | None:
        return None


@dataclass(frozen=True)
class Conversation:
    """A multi-turn chat: each turn resends the history with the server's real answers in it."""

    turns: tuple[str, ...]  # the user's messages
    system: str = ""
    max_tokens: int = 128
    ignore_eos: bool = True

    def first(self) -> RequestSpec:
        head: tuple[Message, ...] = (("system", self.system),) if self.system else ()
        return RequestSpec(messages=(*head, ("user", self.turns[0])), max_tokens=self.max_tokens,
                           ignore_eos=self.ignore_eos)

    def follow(self, spec: RequestSpec, answer: str) -> RequestSpec | None:
        done = sum(role == "user" for role, _ in spec.messages)
        if done >= len(self.turns):
            return None
        return replace(spec, messages=(*spec.messages, ("assistant", answer), ("user", self.turns[done])))


@dataclass(frozen=True)
class LoadShape:
    """Closed loop (`concurrency` clients, each sending its next request when the last ends) or open loop
    (sessions arrive at `rate` per second; Poisson when burstiness is 1, gamma otherwise; inf: all at once).
    With both, the open loop is capped at `concurrency` requests in flight."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0  # gamma shape: < 1 burstier than Poisson, > 1 more regular
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ValueError("give a concurrency, a rate, or both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be positive (inf: all requests at once)")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError("burstiness must be a positive number")

    def label(self) -> str:
        if self.rate is None:
            return f"concurrency {self.concurrency}"
        cap = f", at most {self.concurrency} in flight" if self.concurrency else ""
        shape = "Poisson" if self.burstiness == 1 else f"gamma, burstiness {self.burstiness:g}"
        return f"rate {self.rate:g}/s ({shape}){cap}"


@dataclass(frozen=True)
class Bounds:
    """When to stop sending: after `num_requests` measured requests or `duration_s` seconds, whichever comes
    first (requests in flight then still finish and count). `warmup` requests go first and are not measured."""

    num_requests: int | None = 200
    duration_s: float | None = None
    warmup: int = 0

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give a request count, a duration, or both")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("num_requests must be at least 1")
        if self.warmup < 0:
            raise ValueError("warmup must not be negative")
