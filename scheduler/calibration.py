"""Warm-up calibration of the step-cost model: fifteen synthetic steps before the server takes requests.

The backend's guess at its step times (cost_prior) is a roofline with assumed machine figures; a few real steps
of the shapes the planner will size correct it before the first user's prompt is chunked by it. The steps run
through an offline engine core on the server's own KV pool and backend (nothing else runs yet), with prompts of
arbitrary ordinary token ids, and every block goes back to the pool afterwards:

1. one short prompt and two tokens, not measured: kernels compile or load, caches warm;
2. one prompt of 16 tokens and its decode steps (one row: the fixed cost of a step);
3. `rows` prompts of 16 tokens together (one prefill step), then their decode steps;
4. while they decode, a prompt of 48 tokens and then a long one (min(256, token budget) tokens): steps that
   mix a prefill chunk into decoding, small and large, as the ITL target will size them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from backends.base import Backend
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.output_processor import TokenizerLike
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_cost import StepCostModel

SHORT_PROMPT = 16


@dataclass(frozen=True)
class Calibration:
    steps: int  # measured steps the model was fitted on
    seconds: float  # the calibration's own time, warm-up included


def calibrate(config: SchedulerConfig, kv: KVCacheManager, backend: Backend, tokenizer: TokenizerLike,
              max_model_len: int, cost: StepCostModel) -> Calibration:
    """Fits `cost` on measured steps (blocking: a second or two on a CPU). Whatever happens, every block the
    calibration took is back in the pool when it returns or raises."""
    config = replace(config, itl_target_ms=0.0)  # full-size chunks: the shapes a target will then cut down
    observed, ids = cost.observed, itertools.count()
    warm = _Driver(EngineCore.for_backend(config, kv, backend, tokenizer, max_model_len=max_model_len,
                                          cost=StepCostModel(cost.prior)), backend, tokenizer.vocab_size, ids)
    run = _Driver(EngineCore.for_backend(config, kv, backend, tokenizer, max_model_len=max_model_len, cost=cost),
                  backend, tokenizer.vocab_size, ids)
    start = warm.core.clock()
    try:
        warm.add(8, max_tokens=2)
        warm.until_idle()
        _measured_steps(run, config, min(max_model_len, kv.max_sequence_tokens))
    finally:
        for driver in (warm, run):
            driver.core.abort_all("calibration ended")
        kv.reset_prefix_cache()  # the synthetic prompts' blocks must never be hit by a real one
    cost.refit()
    return Calibration(cost.observed - observed, run.core.clock() - start)


def _measured_steps(run: _Driver, config: SchedulerConfig, max_len: int) -> None:
    rows = max(1, min(8, config.max_num_seqs - 3))
    long = max(SHORT_PROMPT, min(256, config.max_num_batched_tokens - rows - 2, max_len // 2))
    run.add(SHORT_PROMPT, max_tokens=4)  # a short prefill, then decode steps of one row: the fixed cost
    run.until_idle()
    for _ in range(rows):
        run.add(SHORT_PROMPT, max_tokens=8)
    run.steps(3)
    run.add(min(48, long), max_tokens=2)  # a small chunk beside decoding, then a large one
    run.steps(2)
    run.add(long, max_tokens=2)
    run.until_idle()


class _Driver:
    """Sends synthetic requests to an engine core and steps it synchronously."""

    def __init__(self, core: EngineCore, backend: Backend, vocab_size: int, ids: itertools.count[int]) -> None:
        self.core, self.backend, self.vocab_size, self.ids = core, backend, vocab_size, ids

    def add(self, prompt_len: int, max_tokens: int) -> None:
        n = next(self.ids)
        # distinct prompts (no prefix hits between them), ids well inside the vocabulary
        prompt = tuple((1000 + 7919 * (n * 4096 + i)) % (self.vocab_size - 1000) + 500 for i in range(prompt_len))
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.core.add_request(EngineRequest(f"calibration-{n}", prompt, params))

    def steps(self, count: int) -> None:
        for _ in range(count):
            if not self.core.has_work:
                return
            plan = self.core.plan()
            if plan.batch is None:
                raise RuntimeError("calibration: the KV cache cannot hold the calibration's requests")
            started = self.core.clock()
            self.core.commit(plan, self.backend.execute(plan.batch), started)

    def until_idle(self) -> None:
        while self.core.has_work:
            self.steps(1)
