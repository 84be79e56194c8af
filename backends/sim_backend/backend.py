"""The simulated backend: no weights, deterministic tokens, step time from a roofline cost model."""

from __future__ import annotations

import numpy as np

from backends.base import BackendError, KVGeometry, LongArray, StepBatch, StepOutput
from backends.model.config import ModelConfig
from backends.sim_backend.clock import Clock, RealClock
from backends.sim_backend.cost_model import CostModel, StepCost
from backends.sim_backend.faults import Fault, FaultInjector, InjectedFault
from backends.sim_backend.logprobs import pseudo_logprobs
from backends.sim_backend.profiles import HardwareProfile
from backends.sim_backend.tokens import pick, pick_allowed, row_hashes
from backends.step_shape import CostCoefficients


class SimBackend:
    name = "sim"

    def __init__(self, config: ModelConfig, vocab: LongArray, profile: HardwareProfile, clock: Clock,
                 seed: int = 0, faults: tuple[Fault, ...] = ()) -> None:
        if vocab.size == 0:
            raise ValueError("the model's vocabulary has no ordinary tokens to simulate with")
        self.config = config
        self.vocab = vocab  # the ordinary token ids tokens are drawn from
        self.profile = profile
        self.clock = clock  # the engine reads time from here, so virtual runs report simulated timings
        self.seed = seed
        self.cost_model = CostModel(config, profile)
        self.num_blocks = 0
        self.block_size = 0
        self.last_cost: StepCost | None = None
        self.faults = FaultInjector(faults, seed)

    def use_profile(self, profile: HardwareProfile) -> None:
        """Steps cost what `profile` says from now on (a machine that slows down or speeds up mid-run)."""
        self.profile, self.cost_model = profile, CostModel(self.config, profile)

    def cost_prior(self) -> CostCoefficients:
        """The scheduler's first guess at step times: this profile's roofline, linearized."""
        return self.cost_model.coefficients()

    @property
    def step_is_instant(self) -> bool:
        """No sleeping: a worker-thread hop would cost more than the step itself. Never with faults, which
        may block (and must not block the event loop)."""
        return not self.faults.faults and (self.profile.name == "zero" or not isinstance(self.clock, RealClock))

    @property
    def kv_geometry(self) -> KVGeometry:
        cfg, dtype_bytes = self.config, self.profile.dtype_bytes  # KV at the simulated machine's dtype
        return KVGeometry(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype_bytes=dtype_bytes)

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        if window_blocks > 0:  # kv_geometry reports no window layers: no pool of their own to size
            raise BackendError("the sim backend keeps every layer's KV in one pool: window_blocks must be 0")
        self.num_blocks, self.block_size = num_blocks, block_size  # no KV to hold: just remember the shape

    def execute(self, batch: StepBatch) -> StepOutput:
        start = self.clock.now()
        firing = self.faults.next_step() if self.faults.faults else ()
        poisoned = self.faults.poisoned(batch.seq_ids) if self.faults.faults else None
        if poisoned is not None:
            raise InjectedFault(f"injected poison: sequence {poisoned} is in step {self.faults.steps}")
        cost = self.cost_model.step_cost(batch)
        output = self._sample(batch, {"forward": cost.seconds})
        self.last_cost = cost
        self.clock.sleep_until(start + cost.seconds)  # the real clock absorbs the time spent above
        return self._inject(firing, output) if firing else output

    def _inject(self, firing: tuple[Fault, ...], output: StepOutput) -> StepOutput:
        for fault in firing:
            if fault.kind == "slow_step":
                self.clock.sleep(fault.seconds or 0.0)
            elif fault.kind == "hang":
                self.faults.hang(fault)
            elif fault.kind == "step_error":
                raise InjectedFault(f"injected step_error on step {self.faults.steps}")
            elif fault.kind == "bad_token" and output.token_ids.size:
                output.token_ids[self.faults.pick_row(output.token_ids.size)] = self._out_of_vocabulary
        return output

    @property
    def _out_of_vocabulary(self) -> int:
        return max(self.config.vocab_size, int(self.vocab.max()) + 1) + 1000

    def _sample(self, batch: StepBatch, timings: dict[str, float]) -> StepOutput:
        params = batch.sampling
        hashes = row_hashes(batch, self.seed)
        index = pick(hashes, self.vocab, None if params is None else params.suppressed_token_ids)
        token_ids = self.vocab[index].astype(np.int64)
        if params is not None and params.allowed is not None:
            token_ids[params.allowed.positions] = pick_allowed(hashes[params.allowed.positions], params.allowed)
        if params is None or not (params.want_logprobs or params.num_top_logprobs > 0):
            return StepOutput(token_ids, timings=timings)
        lp = pseudo_logprobs(hashes, index, self.vocab, params.num_top_logprobs)
        return StepOutput(token_ids, lp.logprobs, lp.top_token_ids, lp.top_logprobs, timings)
