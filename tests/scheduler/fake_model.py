"""A model stand-in for the engine core, with no model files: every token is one character, and the next
token depends only on the position it is sampled at, so a recomputed sequence continues as it would have."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.base import Backend, Clock, KVGeometry, StepBatch, StepOutput
from backends.step_shape import CostCoefficients
from kvpool import new_kv_cache_manager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore

EOS = 2


class CharDetokenizer:
    def push(self, ids: Sequence[int]) -> str:
        return "x" * len(ids)

    def push_token(self, token_id: int) -> str:
        return "x"

    def flush(self) -> str:
        return ""


class CharTokenizer:
    eos_token_ids = (EOS,)
    vocab_size = 64  # the backend's tokens are 2 (EOS) and 10..49

    def detokenizer(self, skip_special_tokens: bool = True) -> CharDetokenizer:
        return CharDetokenizer()


class PositionBackend:
    """The token sampled at position p of sequence s is EOS when p is a multiple of eos_every (0: never), else
    10 + (p + 7 s) % 40: choices of one request differ (a fork's first token is its parent's)."""

    name = "position"
    clock: Clock | None = None
    step_is_instant = True
    kv_geometry = KVGeometry(1, 1, 1)  # holds no KV: any shape

    def __init__(self, eos_every: int = 0) -> None:
        self.eos_every = eos_every

    def cost_prior(self) -> CostCoefficients:
        return CostCoefficients()

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        pass

    def execute(self, batch: StepBatch) -> StepOutput:
        positions = batch.context_lens[batch.sample_rows].astype(np.int64)
        seq_ids = np.array(batch.seq_ids, np.int64)[batch.sample_rows]
        tokens = 10 + (positions + 7 * seq_ids) % 40
        if self.eos_every:
            tokens[positions % self.eos_every == 0] = EOS
        return StepOutput(tokens)


def make_core(num_blocks: int, block_size: int = 4, max_model_len: int = 256, kv_layout: str = "paged",
              kv_max_model_len: int | None = None, enable_prefix_caching: bool = True, **config: object
              ) -> EngineCore:
    """An engine core over a fresh pool; the pool's own max_model_len (the contiguous reservation) may differ."""
    kv = new_kv_cache_manager(kv_layout, num_blocks, block_size, max_model_len=kv_max_model_len or max_model_len,
                              enable_prefix_caching=enable_prefix_caching)
    return EngineCore(SchedulerConfig(**config), kv, CharTokenizer(), max_model_len=max_model_len)  # type: ignore[arg-type]


def run_step(core: EngineCore, backend: Backend) -> bool:
    """One plan, execute, commit; False when nothing could be scheduled."""
    plan = core.plan()
    if plan.batch is None:
        return False
    core.commit(plan, backend.execute(plan.batch), core.clock())
    return True
