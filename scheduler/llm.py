"""The offline API: generate completions for a list of prompts without a server."""

from __future__ import annotations

import itertools

from backends.base import Backend
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig, SpeculativeConfig
from scheduler.core import EngineCore
from scheduler.draft import DraftModel
from scheduler.guided import GuideFactory
from scheduler.output_processor import TokenizerLike
from scheduler.outputs import RequestOutput
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step_cost import StepCostModel
from telemetry.interface import EngineObserver


class LLM:
    """Drives the same engine core synchronously: plan, execute on the backend, commit, until done."""

    def __init__(self, scheduler_config: SchedulerConfig, kv: KVCacheManager, backend: Backend,
                 tokenizer: TokenizerLike, *, max_model_len: int, observer: EngineObserver | None = None,
                 cost: StepCostModel | None = None, guides: GuideFactory | None = None,
                 speculative: SpeculativeConfig | None = None, draft: DraftModel | None = None) -> None:
        self.core = EngineCore.for_backend(scheduler_config, kv, backend, tokenizer, max_model_len=max_model_len,
                                           observer=observer, cost=cost, guides=guides, speculative=speculative,
                                           draft=draft)
        self.backend = backend
        self._ids = itertools.count()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
        """One merged output per prompt, in order (every prompt is in flight at once)."""
        streams = [self.core.add_request(EngineRequest(f"offline-{next(self._ids)}", tuple(p), params))
                   for p in prompts]
        self.run_until_idle()
        return [stream.take_finished() for stream in streams]

    def run_until_idle(self) -> int:
        """Step until no work is left; returns the number of steps."""
        steps = 0
        while self.core.has_work:
            self._draft()
            plan = self.core.plan()
            if plan.batch is None:
                raise RuntimeError("the scheduler could not place any waiting request (KV cache too small)")
            started = self.core.clock()
            self.core.commit(plan, self.backend.execute(plan.batch), started)
            if self.core.config.debug_checks:
                self.core.check_consistency()
            steps += 1
        return steps

    def _draft(self) -> None:
        """The draft model's guesses for the step about to be planned (speculative_method "draft")."""
        draft, scheduler = self.core.draft, self.core.scheduler
        jobs = scheduler.draft_jobs()
        if draft is not None and jobs and scheduler.speculator is not None:
            scheduler.speculator.take_drafts(draft.propose(jobs))
