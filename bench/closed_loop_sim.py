"""Closed-loop clients against the engine alone (no HTTP): on the sim backend's virtual clock every token's
time exactly, on a real backend its real times with no service beside it.

`clients` requests are in the engine at all times (each client sends its next request when its last one
ended), prompts of `prompt_len` random ordinary tokens, `output_len` tokens each, until `requests` have been
sent and finished. No HTTP and no real time: the engine core is stepped synchronously and every timestamp is
simulated, so a run of minutes of serving on an H100 profile takes seconds and gives the same numbers each
time. `switch_profile_at` changes the hardware profile after that many steps (a machine slowing down).
`run_engine` drives any backend the same way, on the monotonic clock unless the backend has its own.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.base import Backend
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend import SimBackend, create, get_profile
from kvpool import PagedKVCacheManager
from scheduler.calibration import calibrate
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_cost import StepCostModel
from telemetry.interface import NullObserver, RequestRecord, StepRecord, TokenRecord

BLOCK = 16


@dataclass(frozen=True)
class Load:
    clients: int
    prompt_len: int
    output_len: int
    requests: int
    seed: int = 0


@dataclass
class Timeline(NullObserver):
    """Each request's token times and every step's record, from the engine's (virtual) clock."""

    token_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    steps: list[StepRecord] = field(default_factory=list)
    finished: int = 0
    itl_target_s: float = 0.0  # the ITL target the scheduler holds steps to, as the engine reported it

    def itl_target(self, seconds: float) -> None:
        self.itl_target_s = seconds

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        self.steps.append(step)
        for t in tokens:
            self.token_times[t.request_id].extend([t.time] * t.num_tokens)

    def request_finished(self, record: RequestRecord) -> None:
        if record.error is not None:
            raise RuntimeError(f"request {record.request_id} failed: {record.error}")
        self.finished += 1


@dataclass(frozen=True)
class SimResult:
    itl: np.ndarray  # seconds between consecutive tokens, all requests pooled
    tpot: np.ndarray  # per request: (last token - first) / (tokens - 1)
    ttft: np.ndarray  # per request: first token - sent
    output_tokens: int
    duration: float  # first request sent to last token
    steps: list[StepRecord]
    itl_target_s: float = 0.0  # the ITL target in force (0: off)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.duration

    def p(self, name: str, q: float) -> float:
        return float(np.percentile(getattr(self, name), q))


def simulate(files: ModelFiles, profile: str, config: SchedulerConfig, load: Load, sim_model: str = "",
             switch_profile_at: tuple[int, str] | None = None) -> SimResult:
    backend = create(BackendConfig(name="sim", sim_profile=profile, sim_clock="virtual", sim_model=sim_model), files)
    assert isinstance(backend, SimBackend)

    def before_step(steps: int) -> None:
        if switch_profile_at is not None and steps == switch_profile_at[0]:
            backend.use_profile(get_profile(switch_profile_at[1]))

    return run_engine(backend, files, config, load, before_step=before_step)


def run_engine(backend: Backend, files: ModelFiles, config: SchedulerConfig, load: Load,
               cost: StepCostModel | None = None, before_step: Callable[[int], None] | None = None) -> SimResult:
    """`load` through an engine core over `backend` (its cache initialised here), stepped synchronously."""
    per_seq = -(-(load.prompt_len + load.output_len) // BLOCK) + 1
    num_blocks = load.clients * per_seq + BLOCK  # never short of KV: no preemption in the numbers
    backend.init_cache(num_blocks, BLOCK)
    max_len = load.prompt_len + load.output_len + BLOCK
    kv = PagedKVCacheManager(num_blocks, BLOCK, enable_prefix_caching=False)
    if cost is None and config.targets_itl and not isinstance(backend, SimBackend):
        cost = StepCostModel(backend.cost_prior())
        calibrate(config, kv, backend, files.tokenizer, max_len, cost)
    timeline = Timeline()
    core = EngineCore.for_backend(config, kv, backend, files.tokenizer, max_model_len=max_len, observer=timeline,
                                  cost=cost)
    sent = _Clients(core, load, core.clock)
    while core.has_work:
        if before_step is not None:
            before_step(len(timeline.steps))
        plan = core.plan()
        if plan.batch is None:
            raise RuntimeError("the scheduler could not place a request")
        started = core.clock()
        core.commit(plan, backend.execute(plan.batch), started)
        sent.top_up(timeline.finished)
    return _result(timeline, sent)


class _Clients:
    def __init__(self, core: EngineCore, load: Load, now: Callable[[], float]) -> None:
        self.core, self.load, self.now = core, load, now
        self.rng = random.Random(load.seed)
        self.sent_at: dict[str, float] = {}
        for _ in range(min(load.clients, load.requests)):
            self._send()

    def top_up(self, finished: int) -> None:
        """One new request per finished one, until all were sent."""
        while len(self.sent_at) < self.load.requests and len(self.sent_at) - finished < self.load.clients:
            self._send()

    def _send(self) -> None:
        request_id = f"r{len(self.sent_at)}"
        now = self.now()
        self.sent_at[request_id] = now
        prompt = tuple(self.rng.randrange(1000, 40000) for _ in range(self.load.prompt_len))
        params = SamplingParams(temperature=0.0, max_tokens=self.load.output_len, ignore_eos=True)
        self.core.add_request(EngineRequest(request_id, prompt, params, arrival_time=now))


def _result(timeline: Timeline, clients: _Clients) -> SimResult:
    times = timeline.token_times
    itl = np.concatenate([np.diff(t) for t in times.values()])
    tpot = np.array([(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1])
    ttft = np.array([times[r][0] - sent for r, sent in clients.sent_at.items()])
    end = max(t[-1] for t in times.values())
    return SimResult(itl, tpot, ttft, sum(len(t) for t in times.values()), end - min(clients.sent_at.values()),
                     timeline.steps, timeline.itl_target_s)
