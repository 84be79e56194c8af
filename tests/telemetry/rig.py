"""An engine core on the sim backend, stepped by hand, with a Telemetry observer: scenarios run on a virtual
clock (instant, exact timings) or the real one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.outputs import RequestOutput, RequestStream
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry import Telemetry
from telemetry.interface import NullObserver, RequestRecord, StepRecord, TokenRecord

BLOCK_SIZE = 16


class Tee(NullObserver):
    """Forwards every hook to the telemetry and keeps the engine's records (the client's view)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.finished: dict[str, RequestRecord] = {}
        self.steps: list[StepRecord] = []

    def request_queued(self, request_id: str, now: float, prompt_tokens: int, params: Any,
                       trace_context: Any) -> None:
        self.telemetry.request_queued(request_id, now, prompt_tokens, params, trace_context)

    def request_preempted(self, request_id: str, now: float) -> None:
        self.telemetry.request_preempted(request_id, now)

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        self.steps.append(step)
        self.telemetry.step_finished(step, tokens)

    def request_finished(self, record: RequestRecord) -> None:
        self.finished[record.request_id] = record
        self.telemetry.request_finished(record)

    def request_rejected(self, reason: str) -> None:
        self.telemetry.request_rejected(reason)


def sim_backend(files: ModelFiles, profile: str = "cpu", clock: str = "virtual") -> SimBackend:
    return create(BackendConfig(name="sim", sim_profile=profile, sim_clock=clock), files)


@dataclass
class Rig:
    core: EngineCore
    backend: SimBackend
    tee: Tee
    streams: dict[str, RequestStream] = field(default_factory=dict)

    def submit(self, request_id: str, prompt_len: int, max_tokens: int, trace_context: Any = None,
               seed: int = 0, priority: int = 0, n: int = 1) -> RequestStream:
        prompt = tuple(1000 + (97 * seed + 13 * j) % 20000 for j in range(prompt_len))
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, n=n)
        request = EngineRequest(request_id, prompt, params, priority, arrival_time=self.backend.clock.now(),
                                trace_context=trace_context)
        self.streams[request_id] = stream = self.core.add_request(request)
        return stream

    def step(self) -> None:
        plan = self.core.plan()
        assert plan.batch is not None, "nothing could be scheduled"
        started = self.core.clock()
        self.core.commit(plan, self.backend.execute(plan.batch), started)

    def run(self) -> dict[str, RequestOutput]:
        while self.core.has_work:
            self.step()
        outs = {rid: stream.take_finished() for rid, stream in self.streams.items()}
        self.streams.clear()
        return outs


def make_rig(files: ModelFiles, telemetry_factory: Callable[[Callable[[], float]], Telemetry], *,
             profile: str = "cpu", clock: str = "virtual", num_blocks: int = 512, max_model_len: int = 2048,
             **scheduler: Any) -> tuple[Rig, Telemetry]:
    """telemetry_factory(engine_clock) -> Telemetry."""
    backend = sim_backend(files, profile, clock)
    backend.init_cache(num_blocks, BLOCK_SIZE)
    telemetry = telemetry_factory(backend.clock.now)
    tee = Tee(telemetry)
    kv = PagedKVCacheManager(num_blocks, BLOCK_SIZE)
    core = EngineCore(SchedulerConfig(**scheduler), kv, files.tokenizer, max_model_len=max_model_len,
                      observer=tee, clock=backend.clock.now)
    return Rig(core, backend, tee), telemetry
