"""KV capacity and pool cost: paged vs contiguous KV in one memory budget, and the pool's own overhead.

    python -m bench.kv_capacity [--kv-cache-memory 2GiB] [--max-model-len 8192] [--seeds 5]

1. Capacity. A seeded long-tailed workload (log-normal prompt and output lengths, total capped at
   max_model_len) runs through the paged and the contiguous KV cache, with the default model's KV geometry:
   - fit: requests admitted in arrival order, each holding its whole lifetime (prompt + output),
     until the next one does not fit: how many sequences the budget holds at once;
   - continuous batching: admit while blocks allow, decode one token per running sequence a step,
     preempt the newest sequence when blocks run out; reports the mean batch size over the steps
     where requests were still waiting (memory-bound), preemptions, and steps to drain the workload.
2. Pool cost (CPU time). 100k 16-token blocks handed out and returned: half by prompt-sized allocate()
   calls, half one block per append() call, all returned by free(); reported per block operation
   (one block handed out or returned), per phase, and per token for decode appends (one append() call a
   round for 64 sequences, one token each, as a scheduler step makes it).
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import astuple, dataclass, field

from kvpool import KVCacheManager, KVSpec, PagedKVCacheManager, new_kv_cache_manager, parse_size

SMOLLM2_KV = KVSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=4, block_size=16)


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    output_len: int


@dataclass(eq=False)  # identity: running-list membership
class Running:
    seq_id: int
    tokens: list[int]
    target_len: int


@dataclass
class SimResult:
    steps: int = 0
    preemptions: int = 0
    concurrency: list[int] = field(default_factory=list)


def make_workload(seed: int, count: int, max_model_len: int) -> list[Request]:
    """Log-normal lengths (median prompt 300, output 150 tokens, sigma 1): most short, a few very long."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        prompt_len = min(max_model_len - 1, max(1, round(rng.lognormvariate(math.log(300), 1.0))))
        output_len = min(max_model_len - prompt_len, max(1, round(rng.lognormvariate(math.log(150), 1.0))))
        requests.append(Request([rng.randrange(49152) for _ in range(prompt_len)], output_len))
    return requests


def new_manager(num_blocks: int, layout: str, max_model_len: int) -> KVCacheManager:
    # Unique random prompts never hit the prefix cache; turn it off so both layouts do the same work.
    return new_kv_cache_manager(layout, num_blocks, 16, max_model_len=max_model_len, enable_prefix_caching=False)


def lifetime_fit(manager: KVCacheManager, requests: list[Request]) -> int:
    """Sequences admitted in order, each with its whole lifetime of tokens, before one does not fit."""
    for seq_id, request in enumerate(requests):
        tokens = request.prompt + [0] * request.output_len
        if not manager.can_allocate(tokens, len(tokens)):
            return seq_id
        manager.allocate(seq_id, tokens, len(tokens))
    return len(requests)


def admit(manager: KVCacheManager, waiting: deque[Running], running: list[Running]) -> None:
    while waiting and manager.can_allocate(waiting[0].tokens, len(waiting[0].tokens)):
        seq = waiting.popleft()
        manager.allocate(seq.seq_id, seq.tokens, len(seq.tokens))
        running.append(seq)


def decode_one(manager: KVCacheManager, seq: Running, running: list[Running], waiting: deque[Running]) -> int:
    """Append one token to seq, preempting the newest sequences until it fits; returns preemptions."""
    seq.tokens.append(len(seq.tokens) % 49152)
    preempted = 0
    while manager.append([seq.seq_id], [seq.tokens], [1])[0] == 0:  # out of blocks
        victim = running.pop()  # the newest admitted loses the least work; it keeps its tokens
        manager.free(victim.seq_id)
        waiting.appendleft(victim)
        preempted += 1
        if victim is seq:
            break
    return preempted


def step(manager: KVCacheManager, running: list[Running], waiting: deque[Running], result: SimResult) -> None:
    for seq in list(running):
        if seq in running:
            result.preemptions += decode_one(manager, seq, running, waiting)
    for seq in [s for s in running if len(s.tokens) >= s.target_len]:
        running.remove(seq)
        manager.free(seq.seq_id)
    admit(manager, waiting, running)
    result.steps += 1
    if waiting:  # memory, not demand, limits the batch: this is the concurrency the budget allows
        result.concurrency.append(len(running))


def continuous_batching(manager: KVCacheManager, requests: list[Request]) -> SimResult:
    waiting = deque(
        Running(i, list(r.prompt), len(r.prompt) + r.output_len) for i, r in enumerate(requests)
    )
    running: list[Running] = []
    result = SimResult()
    admit(manager, waiting, running)
    while running or waiting:
        step(manager, running, waiting, result)
    manager.check_invariants()
    return result


@dataclass(frozen=True)
class LayoutRun:
    fit: float
    batch: float
    steps: float
    preemptions: float


def run_layout(layout: str, num_blocks: int, max_model_len: int, requests: list[Request]) -> LayoutRun:
    fit = lifetime_fit(new_manager(num_blocks, layout, max_model_len), requests)
    sim = continuous_batching(new_manager(num_blocks, layout, max_model_len), requests)
    return LayoutRun(fit, statistics.fmean(sim.concurrency or [0]), sim.steps, sim.preemptions)


def mean_run(runs: list[LayoutRun]) -> LayoutRun:
    return LayoutRun(*(statistics.fmean(col) for col in zip(*(astuple(r) for r in runs), strict=True)))


def capacity_report(num_blocks: int, max_model_len: int, seeds: int, count: int) -> None:
    runs: dict[str, list[LayoutRun]] = {"paged": [], "contiguous": []}
    for seed in range(seeds):
        requests = make_workload(seed, count, max_model_len)
        for layout, layout_runs in runs.items():
            layout_runs.append(run_layout(layout, num_blocks, max_model_len, requests))
    paged, contiguous = mean_run(runs["paged"]), mean_run(runs["contiguous"])
    print(f"{'layout':<11} {'fit (seqs)':>10} {'batch (backlogged)':>18} {'steps':>8} {'preemptions':>11}")
    for name, run in (("paged", paged), ("contiguous", contiguous)):
        print(f"{name:<11} {run.fit:>10.1f} {run.batch:>18.1f} {run.steps:>8.0f} {run.preemptions:>11.1f}")
    print(
        f"paged / contiguous: fit {paged.fit / contiguous.fit:.1f}x, "
        f"batch {paged.batch / contiguous.batch:.1f}x, "
        f"{contiguous.steps / paged.steps:.1f}x fewer steps to drain"
    )


@dataclass(frozen=True)
class PoolCost:
    """CPU seconds of each phase of one 100k-block cycle."""

    allocate: float  # half the blocks, handed out by prompt-sized allocate() calls (100 blocks each)
    append: float  # the other half, handed out one block per append() call (decode growth)
    free: float  # every block returned, tail first

    @property
    def total(self) -> float:
        return self.allocate + self.append + self.free


def timed(run: Callable[[], object]) -> float:
    # CPU time, not wall time: the pool is single-threaded and the bench box is shared.
    start = time.process_time()
    run()
    return time.process_time() - start


def block_cycle(num_blocks: int, caching: bool, blocks_per_seq: int = 100) -> PoolCost:
    manager = PagedKVCacheManager(num_blocks, 16, enable_prefix_caching=caching)
    seqs = num_blocks // blocks_per_seq
    tokens = [list(range(s * 16 * blocks_per_seq, (s + 1) * 16 * blocks_per_seq)) for s in range(seqs)]
    bulk, grown = range(seqs // 2), range(seqs // 2, seqs)
    one_block = {seq_id: ((seq_id,), (tokens[seq_id],), (16,)) for seq_id in grown}  # append()'s arguments

    def allocate() -> None:
        for seq_id in bulk:
            manager.allocate(seq_id, tokens[seq_id], 16 * blocks_per_seq)

    def append() -> None:
        for seq_id in grown:
            manager.allocate(seq_id, tokens[seq_id], 16)
            for _ in range(blocks_per_seq - 1):
                manager.append(*one_block[seq_id])

    def free() -> None:
        for seq_id in range(seqs):
            manager.free(seq_id)

    return PoolCost(timed(allocate), timed(append), timed(free))


def decode_appends(num_tokens: int, caching: bool, seqs: int = 64) -> float:
    """CPU seconds for num_tokens one-token appends to `seqs` sequences, one append() call for all of them a
    round (a scheduler step's call)."""
    manager = PagedKVCacheManager(num_tokens // 16 + 2 * seqs, 16, enable_prefix_caching=caching)
    tokens = [list(range(s, s + num_tokens // seqs + 1)) for s in range(seqs)]
    for seq_id in range(seqs):
        manager.allocate(seq_id, tokens[seq_id], 1)
    seq_ids, ones = list(range(seqs)), [1] * seqs

    def run() -> None:
        for _ in range(num_tokens // seqs):
            manager.append(seq_ids, tokens, ones)

    return timed(run)


def call_overhead_ns() -> float:
    """Interpreter speed reference: one empty Python function call, best of 5."""

    def noop() -> None:
        pass

    def calls() -> None:
        for _ in range(1_000_000):
            noop()

    return min(timed(calls) for _ in range(5)) * 1e3


def cost_report(num_blocks: int, repeats: int = 5, decode_tokens: int = 200_000) -> None:
    print(
        f"pool cost: CPU time, best of {repeats}; Python {platform.python_version()}, "
        f"an empty function call costs {call_overhead_ns():.0f} ns here"
    )
    half = num_blocks / 2
    for caching in (False, True):
        cost = min((block_cycle(num_blocks, caching) for _ in range(repeats)), key=lambda c: c.total)
        decode = min(decode_appends(decode_tokens, caching) for _ in range(repeats))
        print(
            f"prefix caching {'on ' if caching else 'off'}: {num_blocks} blocks out and back in "
            f"{cost.total * 1e3:.0f} ms = {cost.total / (2 * num_blocks) * 1e6:.2f} us/block-op "
            f"[allocate {cost.allocate / half * 1e6:.2f}, append {cost.append / half * 1e6:.2f}, "
            f"free {cost.free / num_blocks * 1e6:.2f} us/block]; "
            f"decode append {decode / decode_tokens * 1e6:.2f} us/token"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kv-cache-memory", default="2GiB")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=100_000, help="blocks in the pool-cost benchmark")
    parser.add_argument("--repeats", type=int, default=5, help="pool-cost runs; the fastest is reported")
    args = parser.parse_args(argv)
    num_blocks = SMOLLM2_KV.num_blocks_for(parse_size(args.kv_cache_memory))
    print(
        f"KV budget {args.kv_cache_memory} = {num_blocks} blocks x 16 tokens "
        f"(SmolLM2-135M, fp32: {SMOLLM2_KV.bytes_per_token} B/token); max_model_len {args.max_model_len}; "
        f"{args.requests} requests x {args.seeds} seeds"
    )
    capacity_report(num_blocks, args.max_model_len, args.seeds, args.requests)
    cost_report(args.blocks, args.repeats)


if __name__ == "__main__":
    main()
