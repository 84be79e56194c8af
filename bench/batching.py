"""Continuous vs static batching at equal concurrency on a seeded, long-tailed workload.

    python -m bench.batching [--workload chat|prompt-heavy] [--sim-requests 256] [--concurrency 32]
                             [--cpu-concurrency 4] [--numpy-requests 32] [--numpy-concurrency 4]
                             [--numpy-repeats 2] [--numpy-clock wall|cpu|both] [--skip-sim] [--skip-numpy]
                             [--open-loop [--rate R]] [--seed 0]

Prompt and output lengths are log-normal (sigma 1: most requests short, a few long); the default "chat"
workload has ShareGPT's shape (outputs about twice the prompts). Every request asks for a fixed number of
tokens and ignores EOS, so both policies produce exactly the same tokens and only the order and grouping of
the work differs. Equal concurrency: `concurrency` closed-loop clients, each sending its next request as soon
as its last one finished (vLLM's benchmark with --max-concurrency), and max_num_seqs = `concurrency` for both
policies, with a token budget that admits a whole batch of prompts in one step; so static batching always
forms full batches. With --open-loop every request arrives at t=0 (or, with --rate R on the sim backend, on a
seeded Poisson schedule). On the sim backend a third row runs continuous batching with a 512-token budget
(chunked prefill). Prefix caching is off and the KV pool never runs short, so no run preempts.

Backends: the sim backend on the virtual clock (simulated time: instant whatever the hardware modelled) with
the "h200" profile at --concurrency, and the "cpu" profile at --concurrency and at --cpu-concurrency; then
the real NumPy model on this CPU, static and continuous interleaved --numpy-repeats times and the best run of
each compared, timed twice: by wall time with BLAS and the C kernels' threads as configured, and by the CPU
time of the engine's thread with one thread (time the host gives to other processes does not count, so this
one stays steady on a shared, busy machine). Timestamps come from the engine's clock: TTFT is first token -
the request's send time, TPOT is the mean gap between a request's later tokens ((last - first) / (tokens -
1)), throughput is output tokens / makespan. Targets: continuous >= 2x static output throughput, and <= 1/2
of its p99 TTFT.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from threadpoolctl import threadpool_info, threadpool_limits

from backends.base import Backend
from backends.config import BackendConfig
from backends.model.loader import ModelFiles, load_model, open_model
from backends.numpy_backend.process_env import reexec_with_defaults
from backends.sim_backend import RealClock, create
from bench.stats import pct
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from telemetry.interface import NullObserver, RequestRecord, StepRecord, TokenRecord

BLOCK = 16
CHUNKED_BUDGET = 512


@dataclass(frozen=True)
class Workload:
    name: str
    count: int
    prompt_median: int
    prompt_cap: int
    output_median: int
    output_cap: int


# name -> (sim workload, NumPy workload). "chat" has ShareGPT's shape (vLLM's paper: prompts 161 and outputs 338
# tokens on average, so medians about 100 and 200 at sigma 1), scaled down for the NumPy model on a CPU;
# "prompt-heavy" has twice as many prompt tokens as output tokens.
WORKLOADS = {
    "chat": (Workload("sim", 256, prompt_median=100, prompt_cap=2048, output_median=200, output_cap=1024),
             Workload("numpy", 16, prompt_median=24, prompt_cap=96, output_median=48, output_cap=192)),
    "prompt-heavy": (Workload("sim", 256, prompt_median=200, prompt_cap=2048, output_median=100, output_cap=1024),
                     Workload("numpy", 16, prompt_median=24, prompt_cap=96, output_median=12, output_cap=48)),
}


@dataclass(frozen=True)
class Job:
    arrival: float  # seconds after the start
    prompt: tuple[int, ...]
    max_tokens: int


def make_jobs(w: Workload, seed: int, rate: float = 0.0) -> list[Job]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for _ in range(w.count):
        prompt_len = min(w.prompt_cap, max(1, round(rng.lognormvariate(math.log(w.prompt_median), 1.0))))
        output_len = min(w.output_cap, max(1, round(rng.lognormvariate(math.log(w.output_median), 1.0))))
        prompt = tuple(rng.randrange(1000, 40000) for _ in range(prompt_len))
        jobs.append(Job(t, prompt, output_len))
        if rate > 0:
            t += rng.expovariate(rate)
    return jobs


class Timeline(NullObserver):
    """First and last token time of each request, and the batch size of each step, from the engine's clock."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        self.step_seqs: list[int] = []
        self.preemptions = 0
        self.finished: list[RequestRecord] = []

    def step_finished(self, step: StepRecord, tokens: Sequence[TokenRecord]) -> None:
        self.step_seqs.append(step.num_seqs)
        self.preemptions += step.preemptions
        for t in tokens:
            self.first.setdefault(t.request_id, t.time)
            self.last[t.request_id] = t.time
            self.tokens[t.request_id] = self.tokens.get(t.request_id, 0) + t.num_tokens

    def request_finished(self, record: RequestRecord) -> None:
        self.finished.append(record)


@dataclass
class Result:
    label: str
    policy: str
    output_tokens: int
    makespan: float
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    mean_batch: float = 0.0
    steps: int = 0
    preemptions: int = 0
    wall: float = 0.0

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.makespan


class Submitter:
    """Hands jobs to the engine. Closed loop (`clients` > 0): that many clients, each sending its next request
    when its last one finished, so `clients` requests are always in the server and TTFT counts from the
    moment each was sent (vLLM's benchmark --max-concurrency). Open loop: each job at its arrival time."""

    def __init__(self, core: EngineCore, jobs: list[Job], clients: int, now: Callable[[], float]) -> None:
        self.core, self.now, self.clients = core, now, clients
        self.pending = deque(jobs)
        self.t0 = now()
        self.arrivals: dict[str, float] = {}
        self.max_tokens: dict[str, int] = {}
        if clients:
            self._send(min(clients, len(jobs)), self.t0)

    def due(self, finished: int) -> None:
        """Send what is due now: after `finished` more requests ended (closed), or by arrival time (open)."""
        if self.clients:
            self._send(min(finished, len(self.pending)), self.now())
            return
        count = 0
        while count < len(self.pending) and self.pending[count].arrival <= self.now() - self.t0:
            count += 1
        self._send(count, None)

    def next_arrival(self) -> float:
        """When the next open-loop job arrives; closed-loop clients only ever wait on the engine."""
        if self.clients:
            raise RuntimeError("closed loop: the engine has no work yet requests are still to be sent")
        return self.t0 + self.pending[0].arrival

    def _send(self, count: int, at: float | None) -> None:
        for _ in range(count):
            job = self.pending.popleft()
            request_id = f"q{len(self.arrivals)}"
            arrival = at if at is not None else self.t0 + job.arrival
            self.arrivals[request_id], self.max_tokens[request_id] = arrival, job.max_tokens
            params = SamplingParams(temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True)
            self.core.add_request(EngineRequest(request_id, job.prompt, params, arrival_time=arrival))


def run_policy(label: str, policy: str, backend: Backend, files: ModelFiles, jobs: list[Job], concurrency: int,
               budget: int, now: Callable[[], float], wait_until: Callable[[float], None],
               closed_loop: bool = True) -> Result:
    """Drive an EngineCore step by step (plan, execute, commit), sending jobs as the Submitter says."""
    longest = max(len(j.prompt) + j.max_tokens for j in jobs)
    num_blocks = concurrency * -(-longest // BLOCK) + 2 * concurrency  # never short of KV: no preemption noise
    backend.init_cache(num_blocks, BLOCK)
    kv = PagedKVCacheManager(num_blocks, BLOCK, enable_prefix_caching=False)
    timeline = Timeline()
    config = SchedulerConfig(max_num_seqs=concurrency, max_num_batched_tokens=budget, batching=policy,
                             max_waiting_requests=len(jobs) + 1, max_waiting_tokens=1 << 30)
    core = EngineCore(config, kv, files.tokenizer, max_model_len=longest + BLOCK, observer=timeline, clock=now)
    wall0 = time.perf_counter()
    submitter = Submitter(core, jobs, concurrency if closed_loop else 0, now)
    finished = 0
    while submitter.pending or core.has_work:
        submitter.due(len(timeline.finished) - finished)
        finished = len(timeline.finished)
        if not core.has_work:
            wait_until(submitter.next_arrival())
            continue
        plan = core.plan()
        if plan.batch is None:
            raise RuntimeError("the scheduler could not place any request")
        started = now()
        core.commit(plan, backend.execute(plan.batch), started)
    return _result(label, policy, timeline, submitter, time.perf_counter() - wall0)


def _result(label: str, policy: str, timeline: Timeline, submitter: Submitter, wall: float) -> Result:
    arrivals = submitter.arrivals
    assert len(timeline.finished) == len(arrivals) and not any(r.error for r in timeline.finished)
    assert all(timeline.tokens[r] == n for r, n in submitter.max_tokens.items())
    ttft = [timeline.first[r] - a for r, a in arrivals.items()]
    tpot = [(timeline.last[r] - timeline.first[r]) / (timeline.tokens[r] - 1) for r in arrivals
            if timeline.tokens[r] > 1]
    return Result(label, policy, sum(timeline.tokens.values()), max(timeline.last.values()) - submitter.t0, ttft,
                  tpot, sum(timeline.step_seqs) / len(timeline.step_seqs), len(timeline.step_seqs),
                  timeline.preemptions, wall)


def compare(label: str, make_backend: Callable[[], Backend], files: ModelFiles, jobs: list[Job], concurrency: int,
            now: Callable[[], float], wait_until: Callable[[float], None], chunked: bool = True,
            repeats: int = 1, closed_loop: bool = True) -> list[Result]:
    """Static, continuous, and (optionally) continuous with chunked prefill; `repeats` interleaved rounds."""
    whole_batch = concurrency * max(len(j.prompt) for j in jobs)  # every prompt of a full batch in one step
    runs = [("static", whole_batch), ("continuous", whole_batch)]
    if chunked and CHUNKED_BUDGET < whole_batch:
        runs.append(("continuous", CHUNKED_BUDGET))
    results = []
    for _ in range(repeats):
        for policy, budget in runs:
            result = run_policy(label, policy, make_backend(), files, jobs, concurrency, budget, now, wait_until,
                                closed_loop)
            result.policy = policy if budget == whole_batch else f"{policy} (chunked {budget})"
            results.append(result)
    return results


def sim_results(files: ModelFiles, profile: str, jobs: list[Job], concurrency: int,
                closed_loop: bool = True) -> list[Result]:
    backends = []

    def make() -> Backend:
        backend = create(BackendConfig(name="sim", sim_profile=profile, sim_clock="virtual"), files)
        backends.append(backend)
        return backend

    # One virtual clock per run, read through whichever backend is current.
    return compare(f"sim {profile}", make, files, jobs, concurrency, lambda: backends[-1].clock.now(),
                   lambda t: backends[-1].clock.sleep_until(t), closed_loop=closed_loop)


def numpy_results(jobs: list[Job], concurrency: int, repeats: int, clock_kind: str,
                  closed_loop: bool = True) -> tuple[list[Result], str]:
    """The real model, driven synchronously in this thread. clock_kind "wall": wall time, BLAS and the C
    kernels' OpenMP threads as configured; "cpu": both limited to this one thread and the engine's clock is
    this thread's CPU time, so time the host gives to other work does not count (a dedicated core's view; the
    steadier measure on a shared machine)."""
    from backends.numpy_backend.backend import NumpyBackend  # noqa: PLC0415 - sim runs never load the kernels

    model = load_model()
    backend = NumpyBackend(model)
    if clock_kind == "wall":
        clock = RealClock()
        results = compare("numpy", lambda: backend, model.files, jobs, concurrency, clock.now, clock.sleep_until,
                          chunked=False, repeats=repeats, closed_loop=closed_loop)
        return results, blas_description()

    def no_waiting(deadline: float) -> None:
        raise RuntimeError("the CPU-time clock cannot wait for arrivals")

    with threadpool_limits(limits=1):  # BLAS and OpenMP
        blas = blas_description()
        results = compare("numpy cpu", lambda: backend, model.files, jobs, concurrency, time.thread_time,
                          no_waiting, chunked=False, repeats=repeats, closed_loop=closed_loop)
    return results, blas


def blas_description() -> str:
    """The BLAS library, and the OpenMP runtime of the C kernels, with their thread counts."""
    infos = [i for i in threadpool_info() if i.get("user_api") in ("blas", "openmp")]
    return "; ".join(f"{i['internal_api']} {i.get('version') or ''} kernel={i.get('architecture')} "
                     f"threads={i['num_threads']}" for i in infos) or "unknown"


def print_table(results: list[Result], unit: str) -> None:
    scale = 1e3 if unit == "ms" else 1.0
    print(f"{'backend':<10} {'policy':<24} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
          f"{'TPOT p99':>9} {'batch':>6} {'steps':>6} {'makespan s':>10} {'wall s':>7}")
    print(f"{'':<10} {'':<24} {'':>10} {'(' + unit + ')':>9} {'(' + unit + ')':>9} {'(ms)':>9} {'(ms)':>9}")
    for r in results:
        print(f"{r.label:<10} {r.policy:<24} {r.throughput:>10.1f} {pct(r.ttft, .5) * scale:>9.1f} "
              f"{pct(r.ttft, .99) * scale:>9.1f} {pct(r.tpot, .5) * 1e3:>9.2f} {pct(r.tpot, .99) * 1e3:>9.2f} "
              f"{r.mean_batch:>6.1f} {r.steps:>6d} {r.makespan:>10.2f} {r.wall:>7.1f}")
    static = min((r for r in results if r.policy == "static"), key=lambda r: r.makespan)
    continuous = min((r for r in results if r.policy == "continuous"), key=lambda r: r.makespan)
    gain = continuous.throughput / static.throughput
    ttft_ratio = pct(continuous.ttft, .99) / pct(static.ttft, .99)
    verdict = "met" if gain >= 2 and ttft_ratio <= 0.5 else "NOT met"
    best = " (best run of each)" if len(results) > 3 else ""
    print(f"  continuous / static{best}: throughput x{gain:.2f}, p99 TTFT x{ttft_ratio:.2f} "
          f"(target >= x2 and <= x0.5: {verdict}); steps x{continuous.steps / static.steps:.2f}; "
          f"preemptions {sum(r.preemptions for r in results)}")


def describe(w: Workload, jobs: list[Job], rate: float, clients: int) -> str:
    prompts = sorted(len(j.prompt) for j in jobs)
    outputs = sorted(j.max_tokens for j in jobs)
    arrival = (f"closed loop, {clients} clients" if clients else f"Poisson {rate:g} req/s" if rate > 0
               else "all at t=0")
    return (f"{len(jobs)} requests, {arrival}; prompt tokens median {prompts[len(jobs) // 2]} max {prompts[-1]} "
            f"mean {sum(prompts) / len(jobs):.0f} (log-normal median {w.prompt_median}, sigma 1, cap "
            f"{w.prompt_cap}); output tokens median {outputs[len(jobs) // 2]} max {outputs[-1]} mean "
            f"{sum(outputs) / len(jobs):.0f} (median {w.output_median}, cap {w.output_cap})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=tuple(WORKLOADS), default="chat")
    parser.add_argument("--sim-requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32, help="max_num_seqs on the sim backend")
    parser.add_argument("--cpu-concurrency", type=int, default=4,
                        help="a second sim cpu run at this max_num_seqs (0: none)")
    parser.add_argument("--numpy-requests", type=int, default=32)
    parser.add_argument("--numpy-concurrency", type=int, default=4)
    parser.add_argument("--numpy-repeats", type=int, default=2, help="interleaved rounds of the two policies")
    parser.add_argument("--numpy-clock", choices=("wall", "cpu", "both"), default="both",
                        help="wall time, or this thread's CPU time with one thread (steady on a busy host)")
    parser.add_argument("--skip-numpy", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--open-loop", action="store_true",
                        help="send every request at t=0 (or at --rate) instead of from closed-loop clients")
    parser.add_argument("--rate", type=float, default=0.0, help="with --open-loop: sim arrivals per simulated "
                        "second (0: all at t=0)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run_sim(args: argparse.Namespace, files: ModelFiles) -> None:
    workload = Workload(**{**WORKLOADS[args.workload][0].__dict__, "count": args.sim_requests})
    rate = args.rate if args.open_loop else 0.0
    jobs = make_jobs(workload, args.seed, rate)
    clients = "" if args.open_loop else "clients = "
    print(f"sim workload: {describe(workload, jobs, rate, 0 if args.open_loop else args.concurrency)}")
    print(f"({clients}max_num_seqs = the concurrency for every policy; TTFT in s on the cpu profile, ms on h200)")
    for profile, concurrency in [("cpu", args.concurrency), ("cpu", args.cpu_concurrency), ("h200", args.concurrency)]:
        if concurrency > 0:
            print(f"\nsim {profile}, concurrency {concurrency} (simulated time):")
            results = sim_results(files, profile, jobs, concurrency, not args.open_loop)
            print_table(results, "s" if profile == "cpu" else "ms")


def run_numpy(args: argparse.Namespace) -> None:
    workload = Workload(**{**WORKLOADS[args.workload][1].__dict__, "count": args.numpy_requests})
    jobs = make_jobs(workload, args.seed)
    print(f"\nnumpy workload: {describe(workload, jobs, 0.0, 0 if args.open_loop else args.numpy_concurrency)}")
    for kind in ("wall", "cpu") if args.numpy_clock == "both" else (args.numpy_clock,):
        what = "wall time" if kind == "wall" else "CPU time of the engine's thread, one thread"
        print(f"\nNumPy model on this CPU, concurrency {args.numpy_concurrency} ({what}):")
        results, blas = numpy_results(jobs, args.numpy_concurrency, args.numpy_repeats, kind, not args.open_loop)
        print(f"threads: {blas}")
        print_table(results, "s")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.skip_numpy:
        reexec_with_defaults("bench.batching")
    if not args.skip_sim:
        run_sim(args, open_model()[1])
    if not args.skip_numpy:
        run_numpy(args)


if __name__ == "__main__":
    main()
