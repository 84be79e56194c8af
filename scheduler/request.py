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
