"""A request as the engine receives it: already tokenized and validated."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from scheduler.params import SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    priority: int = 0  # lower runs first under scheduling = "priority" (as vLLM)
    arrival_time: float = field(default_factory=time.monotonic)
    trace_context: Any = None  # opaque to the scheduler; handed to telemetry hooks
    # The id its response carries (the X-Request-Id, as the API prefixes it), which the live dashboard shows;
    # "": request_id, which the service keeps unique when clients send the same X-Request-Id twice.
    public_id: str = ""

    @property
    def shown_id(self) -> str:
        return self.public_id or self.request_id
