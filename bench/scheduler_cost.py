"""Scheduler cost per engine step with 256 running sequences, the backend step excluded.

    python -m bench.scheduler_cost [--seqs 256] [--steps 1000] [--observer null|records] [--temperature T]
                                   [--profile] [--window W]

256 requests (seeded prompt lengths 32-512 tokens, fixed max_tokens so none finishes during the run) are
prefilled on the zero-cost sim backend; then every decode step is timed in three parts, which together are
everything EngineCore.commit() and plan() do:

- `plan`: EngineCore.plan(), i.e. Scheduler.schedule() (budgets, block appends, the StepBatch arrays, sampling
  inputs) and the preemption/first-scheduled bookkeeping;
- `update`: Scheduler.update() (tokens into sequences, stop checks, forks), the first half of commit();
- `outputs`: EngineCore.process_outputs(), the rest of commit() (incremental detokenization, stop strings,
  stream deltas, waking readers, the telemetry records, closing finished requests).

The scheduler is plan + update; output processing is outputs. The backend's execute() runs between plan and
update, untimed. Wall times and this thread's CPU time are both reported: on a shared, busy host the CPU time
is the steadier figure. Target: p99 of the scheduler under 1 ms. `--observer records` adds an observer that
reads every step's records (as the telemetry worker does, but here on the engine's thread); the default is
the engine's default, the NullObserver, for which no records are built. `--temperature` above 0 makes every
request sample (seeded), so each step draws a uniform per sequence. `--profile` adds a cProfile of the
timed steps, top functions by own time. `--window W` plans for a model with sliding layers (Gemma 3: W = 512):
two block tables per sequence, the sliding layers' giving back what falls behind the window.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.config import BackendConfig
from backends.model.loader import ModelFiles, open_model
from backends.sim_backend import SimBackend, create
from bench.stats import pct
from kvpool import KVCacheManager, PagedKVCacheManager, new_hybrid_manager
from kvpool.sizing import window_blocks_wanted
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry.interface import EngineObserver, NullObserver, StepRecord, TokenRecord

BLOCK = 16
MAX_LEN = 4096


PARTS = ("plan", "update", "outputs")


@dataclass
class StepTimes:
    """Per step and part: wall seconds, and this thread's CPU seconds (what a busy, shared host inflates less)."""

    wall: dict[str, list[float]] = field(default_factory=lambda: {part: [] for part in PARTS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {part: [] for part in PARTS})
    execute: list[float] = field(default_factory=list)

    def add(self, wall: tuple[float, ...], cpu: tuple[float, ...]) -> None:
        for part, w, c in zip(PARTS, wall, cpu, strict=True):
            self.wall[part].append(w)
            self.cpu[part].append(c)

    def summed(self, parts: tuple[str, ...], cpu: bool = False) -> list[float]:
        columns = [(self.cpu if cpu else self.wall)[part] for part in parts]
        return [sum(values) for values in zip(*columns, strict=True)]


class RecordReader(NullObserver):
    """Reads every record of every step, as the telemetry worker does (there on its own thread)."""

    def __init__(self) -> None:
        self.tokens = 0

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        self.tokens += sum(record.num_tokens for record in tokens)


def build(files: ModelFiles, num_seqs: int, steps: int, seed: int = 0, observer: EngineObserver | None = None,
          temperature: float = 0.0, window: int = 0) -> tuple[EngineCore, SimBackend]:
    backend = create(BackendConfig(name="sim", sim_profile="zero", sim_clock="virtual"), files)
    rng = random.Random(seed)
    prompts = [[rng.randrange(1000, 40000) for _ in range(rng.randint(32, 512))] for _ in range(num_seqs)]
    budget = 2048
    horizon = steps + sum(map(len, prompts)) // budget + num_seqs + 8  # decode steps during prefill, too
    need = sum(-(-(len(p) + horizon) // BLOCK) for p in prompts)
    backend.init_cache(need, BLOCK)  # the sim holds no KV: the window pool's tables go by unread
    kv = new_pool(need, num_seqs, budget, window)
    config = SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=budget)
    core = EngineCore(config, kv, files.tokenizer, max_model_len=MAX_LEN, clock=backend.clock.now, observer=observer)
    for i, p in enumerate(prompts):  # seeded when sampling, so each request draws its own uniforms
        params = SamplingParams(temperature=temperature, max_tokens=horizon, ignore_eos=True, seed=i)
        core.add_request(EngineRequest(f"r{i}", tuple(p), params))
    while core.scheduler.waiting or any(s.num_uncomputed > 1 for s in core.scheduler.running):  # prefill
        step(core, backend)
    return core, backend


def new_pool(num_blocks: int, num_seqs: int, budget: int, window: int) -> KVCacheManager:
    """The paged pool; with a window, a hybrid one whose sliding layers' pool holds every sequence's window."""
    if not window:
        return PagedKVCacheManager(num_blocks, BLOCK)
    return new_hybrid_manager(num_blocks, window_blocks_wanted(window, BLOCK, num_seqs, budget), BLOCK, window,
                              step_tokens=budget)


def step(core: EngineCore, backend: SimBackend, times: StepTimes | None = None) -> None:
    """One engine step: EngineCore.commit() is exactly scheduler.update() then process_outputs()."""
    c0, t0 = time.thread_time(), time.perf_counter()
    plan = core.plan()
    t1, c1 = time.perf_counter(), time.thread_time()
    assert plan.batch is not None
    output = backend.execute(plan.batch)
    c2, t2 = time.thread_time(), time.perf_counter()
    updates = core.scheduler.update(plan, output)
    t3, c3 = time.perf_counter(), time.thread_time()
    core.process_outputs(plan, updates, t1)
    t4, c4 = time.perf_counter(), time.thread_time()
    if times is not None:
        times.add((t1 - t0, t3 - t2, t4 - t3), (c1 - c0, c3 - c2, c4 - c3))
        times.execute.append(t2 - t1)


def measure(core: EngineCore, backend: SimBackend, steps: int, profiler: cProfile.Profile | None = None
            ) -> StepTimes:
    times = StepTimes()
    gc.collect()
    if profiler is not None:
        profiler.enable()
    for _ in range(steps):
        step(core, backend, times)
    if profiler is not None:
        profiler.disable()
    return times




def report(times: StepTimes, num_seqs: int) -> None:
    rows = (("scheduler", ("plan", "update")), ("  plan", ("plan",)), ("  update", ("update",)),
            ("output processing", ("outputs",)), ("total", PARTS))
    print(f"{'part':<18} {'wall p50':>9} {'p99':>7} {'max':>7} {'mean':>7}   {'CPU p50':>8} {'p99':>7}   (ms)")
    for name, parts in rows:
        wall, cpu = times.summed(parts), times.summed(parts, cpu=True)
        print(f"{name:<18} {pct(wall, 0.5) * 1e3:>9.3f} {pct(wall, 0.99) * 1e3:>7.3f} {max(wall) * 1e3:>7.3f} "
              f"{statistics.fmean(wall) * 1e3:>7.3f}   {pct(cpu, 0.5) * 1e3:>8.3f} {pct(cpu, 0.99) * 1e3:>7.3f}")
    execute = times.execute
    print(f"{'(sim execute)':<18} {pct(execute, 0.5) * 1e3:>9.3f} {pct(execute, 0.99) * 1e3:>7.3f} "
          f"{max(execute) * 1e3:>7.3f} {statistics.fmean(execute) * 1e3:>7.3f}")
    scheduler, total = times.summed(("plan", "update")), times.summed(PARTS)
    print(f"per sequence per step: scheduler {statistics.median(scheduler) / num_seqs * 1e6:.2f} us, "
          f"total {statistics.median(total) / num_seqs * 1e6:.2f} us (p50); target p99 scheduler < 1 ms: "
          f"{'met' if pct(scheduler, 0.99) < 1e-3 else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--observer", choices=("null", "records"), default="null")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above: seeded sampling")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--window", type=int, default=0,
                        help="a sliding window (positions): the hybrid pool of a model with sliding layers")
    args = parser.parse_args(argv)
    files = open_model()[1]
    observer = RecordReader() if args.observer == "records" else None
    core, backend = build(files, args.seqs, args.steps, observer=observer, temperature=args.temperature,
                          window=args.window)
    running = len(core.scheduler.running)
    profiler = cProfile.Profile() if args.profile else None
    times = measure(core, backend, args.steps, profiler)
    assert len(core.scheduler.running) == running == args.seqs, "every sequence must stay running"
    print(f"{args.seqs} running sequences, {args.steps} decode steps on the zero-cost sim backend, "
          f"{args.observer} observer, temperature {args.temperature}"
          + (f", sliding layers' {args.window}-position windows in a pool of their own" if args.window else ""))
    report(times, args.seqs)
    if profiler is not None:
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
