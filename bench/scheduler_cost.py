"""Scheduler cost per engine step: plan() + commit() with 256 running sequences, the backend step excluded.

    python -m bench.scheduler_cost [--seqs 256] [--steps 1000] [--profile]

256 requests (seeded prompt lengths 32-512 tokens, fixed max_tokens so none finishes during the run) are
prefilled on the zero-cost sim backend; then every decode step is timed in two parts: `plan()` (the
scheduler's plan: budgets, block appends, the StepBatch arrays, sampling inputs) and `commit()` (tokens into
sequences, stop checks, incremental detokenization, stream deltas, the telemetry records). The backend's
execute() runs between them untimed. Wall times and this thread's CPU time are both reported: on a shared,
busy host the CPU time is the steadier figure. Target: p99 of plan + commit under 1 ms. `--profile` adds a cProfile of
the timed steps, top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import statistics
import time
from dataclasses import dataclass

from backends.config import BackendConfig
from backends.model.loader import ModelFiles, open_model
from backends.sim_backend import SimBackend, create
from bench.stats import pct
from kvpool import KVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest

BLOCK = 16
MAX_LEN = 4096


@dataclass
class StepTimes:
    plan: list[float]
    commit: list[float]
    execute: list[float]
    cpu: list[float]  # this thread's CPU time in plan + commit: what a busy, shared host does not inflate

    @property
    def total(self) -> list[float]:
        return [p + c for p, c in zip(self.plan, self.commit, strict=True)]


def build(files: ModelFiles, num_seqs: int, steps: int, seed: int = 0) -> tuple[EngineCore, SimBackend]:
    backend = create(BackendConfig(name="sim", sim_profile="zero", sim_clock="virtual"), files)
    rng = random.Random(seed)
    prompts = [[rng.randrange(1000, 40000) for _ in range(rng.randint(32, 512))] for _ in range(num_seqs)]
    budget = 2048
    horizon = steps + sum(map(len, prompts)) // budget + num_seqs + 8  # decode steps during prefill, too
    need = sum(-(-(len(p) + horizon) // BLOCK) for p in prompts)
    backend.init_cache(need, BLOCK)
    kv = KVCacheManager(need, BLOCK, max_model_len=MAX_LEN)
    config = SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=budget)
    core = EngineCore(config, kv, files.tokenizer, max_model_len=MAX_LEN, clock=backend.clock.now)
    params = SamplingParams(temperature=0.0, max_tokens=horizon, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(EngineRequest(f"r{i}", tuple(p), params))
    while core.scheduler.waiting or any(s.num_uncomputed > 1 for s in core.scheduler.running):  # prefill
        step(core, backend)
    return core, backend


def step(core: EngineCore, backend: SimBackend, times: StepTimes | None = None) -> None:
    c0, t0 = time.thread_time(), time.perf_counter()
    plan = core.plan()
    t1, c1 = time.perf_counter(), time.thread_time()
    assert plan.batch is not None
    output = backend.execute(plan.batch)
    c2, t2 = time.thread_time(), time.perf_counter()
    core.commit(plan, output, t1)
    t3, c3 = time.perf_counter(), time.thread_time()
    if times is not None:
        times.plan.append(t1 - t0)
        times.execute.append(t2 - t1)
        times.commit.append(t3 - t2)
        times.cpu.append(c1 - c0 + c3 - c2)


def measure(core: EngineCore, backend: SimBackend, steps: int, profiler: cProfile.Profile | None = None
            ) -> StepTimes:
    times = StepTimes([], [], [], [])
    gc.collect()
    if profiler is not None:
        profiler.enable()
    for _ in range(steps):
        step(core, backend, times)
    if profiler is not None:
        profiler.disable()
    return times




def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    files = open_model()[1]
    core, backend = build(files, args.seqs, args.steps)
    running = len(core.scheduler.running)
    profiler = cProfile.Profile() if args.profile else None
    times = measure(core, backend, args.steps, profiler)
    assert len(core.scheduler.running) == running == args.seqs, "every sequence must stay running"
    print(f"{args.seqs} running sequences, {args.steps} decode steps on the zero-cost sim backend")
    print(f"{'part':<16} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8}")
    for name, values in (("plan", times.plan), ("commit", times.commit), ("plan+commit", times.total),
                         ("plan+commit CPU", times.cpu), ("(sim execute)", times.execute)):
        print(f"{name:<16} {pct(values, 0.5) * 1e3:>8.3f} {pct(values, 0.99) * 1e3:>8.3f} "
              f"{max(values) * 1e3:>8.3f} {statistics.fmean(values) * 1e3:>8.3f}")
    per_seq = statistics.median(times.total) / args.seqs * 1e6
    print(f"per sequence per step: {per_seq:.2f} us (p50); target p99 plan+commit < 1 ms: "
          f"{'met' if pct(times.total, 0.99) < 1e-3 else 'NOT met'}")
    if profiler is not None:
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
