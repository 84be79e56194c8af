"""Event-loop lag under load: how late the engine's event loop wakes a sleeping coroutine.

    python -m bench.loop_lag [--backend numpy|sim] [--clients 24] [--seconds 20] [--uvloop]

The async Engine runs the backend step in a worker thread, so the event loop stays free to stream tokens and
accept requests while the model computes; only plan() and commit() run on the loop. This drives the Engine
with `--clients` closed-loop streaming clients: each submits a request, reads it token by token and submits
the next, until `--seconds` have passed; then each finishes the request it is reading. Backends: the real
NumPy model (the worker thread competes with the loop for the GIL between BLAS calls), or the sim backend on
the real clock (the worker sleeps; with the default "h200" profile a step takes 1-2 ms, so the loop spends
most of its time planning, committing and streaming). A probe coroutine meanwhile does
`await asyncio.sleep(0.001)` in a loop, for as long as any client is still reading, and records how much
longer than 1 ms each sleep took. Target: p99 lag under 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.base import Backend
from backends.config import BackendConfig
from backends.model.loader import ModelFiles, load_model, open_model
from backends.sim_backend import create
from bench.stats import pct
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.engine import Engine
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest

BLOCK = 16
MAX_LEN = 1024
PROBE_SLEEP = 0.001


@dataclass
class Load:
    completed: int = 0
    tokens: int = 0
    reads: int = 0
    lags: list[float] = field(default_factory=list)


def make_backend(name: str, profile: str) -> tuple[Backend, ModelFiles]:
    if name == "numpy":
        from backends.numpy_backend.backend import NumpyBackend  # noqa: PLC0415 - sim runs never load the kernels

        model = load_model()
        return NumpyBackend(model), model.files
    files = open_model()[1]
    return create(BackendConfig(name="sim", sim_profile=profile, sim_clock="real"), files), files


async def client(engine: Engine, index: int, rng: random.Random, load: Load, stop_at: float,
                 prompt_len: int, max_tokens: int) -> None:
    n = 0
    while time.monotonic() < stop_at:
        prompt = tuple(rng.randrange(1000, 40000) for _ in range(rng.randint(prompt_len // 2, prompt_len)))
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(max_tokens // 2, max_tokens),
                                ignore_eos=True)
        stream = engine.submit(EngineRequest(f"c{index}-{n}", prompt, params))
        n += 1
        async for out in stream:  # a fast streaming reader
            load.reads += 1
            load.tokens += sum(len(c.token_ids) for c in out.choices)
        load.completed += 1


async def probe(load: Load, until: Callable[[], bool]) -> None:
    while not until():
        start = time.perf_counter()
        await asyncio.sleep(PROBE_SLEEP)
        load.lags.append(time.perf_counter() - start - PROBE_SLEEP)


async def measure(backend: Backend, files: ModelFiles, clients: int, seconds: float, prompt_len: int,
                  max_tokens: int) -> tuple[Load, list[float], float]:
    num_blocks = clients * -(-(prompt_len + max_tokens) // BLOCK) + clients
    backend.init_cache(num_blocks, BLOCK)
    kv = PagedKVCacheManager(num_blocks, BLOCK)
    engine = Engine(SchedulerConfig(max_num_seqs=clients, max_num_batched_tokens=256), kv, backend,
                    files.tokenizer, max_model_len=MAX_LEN)
    await engine.start()
    load = Load()
    idle_until = time.monotonic() + 1.0
    await probe(load, lambda: time.monotonic() >= idle_until)  # a second of the idle loop, for reference
    idle, load.lags = load.lags, []
    start = time.monotonic()
    stop_at = start + seconds
    rng = random.Random(0)
    clients_done = asyncio.gather(*(client(engine, i, random.Random(rng.random()), load, stop_at, prompt_len,
                                           max_tokens) for i in range(clients)))
    await probe(load, clients_done.done)  # until every client has read its last request to the end
    await clients_done
    elapsed = time.monotonic() - start
    await engine.stop()
    return load, idle, elapsed




def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("numpy", "sim"), default="numpy")
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--sim-profile", default="h200",
                        help="sim hardware profile (h200: 1-2 ms steps, the loop busy most of the time)")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="set sys.setswitchinterval to this many ms first (0: leave the default)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as the server does")
    args = parser.parse_args(argv)
    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval / 1e3)
    backend, files = make_backend(args.backend, args.sim_profile)
    runner = measure(backend, files, args.clients, args.seconds, args.prompt_len, args.max_tokens)
    if args.uvloop:
        import uvloop  # noqa: PLC0415 - only with --uvloop

        load, idle, elapsed = uvloop.run(runner)
    else:
        load, idle, elapsed = asyncio.run(runner)
    lags = load.lags
    loop_name = "uvloop" if args.uvloop else "asyncio"
    name = f"sim {args.sim_profile}" if args.backend == "sim" else args.backend
    print(f"{name} backend, {args.clients} streaming clients, {elapsed:.1f} s on {loop_name} "
          f"(GIL switch interval {sys.getswitchinterval() * 1e3:.0f} ms)")
    print(f"load: {load.completed} requests completed, {load.tokens} tokens streamed "
          f"({load.tokens / elapsed:.1f} tok/s) in {load.reads} reads")
    print(f"idle loop (1 s before the load, for reference): p50 {pct(idle, .5) * 1e3:.2f} ms, "
          f"p99 {pct(idle, .99) * 1e3:.2f} ms, max {max(idle) * 1e3:.2f} ms")
    print(f"lag of asyncio.sleep({PROBE_SLEEP * 1e3:g} ms) over {len(lags)} probes: p50 {pct(lags, .5) * 1e3:.2f} ms, "
          f"p99 {pct(lags, .99) * 1e3:.2f} ms, max {max(lags) * 1e3:.2f} ms; "
          f"target p99 < 10 ms: {'met' if pct(lags, .99) < 0.010 else 'NOT met'}")
    over = ", ".join(f"> {ms} ms: {sum(lag > ms / 1e3 for lag in lags) / len(lags):.2%}" for ms in (5, 10, 50))
    print(f"share of probes late by {over}")


if __name__ == "__main__":
    main()
