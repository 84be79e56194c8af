"""Soak: many requests of every shape, a share of clients hanging up mid-way, then the books must balance.

    python -m bench.reliability.soak [--requests 10000] [--concurrency 64] [--disconnect 0.2] [--seed 0]

Starts a `pagedserve serve` on the sim backend (h200 profile, real clock: steps take their modelled time) with
a KV pool small enough that sequences get preempted, and runs `--requests` requests from `--concurrency`
closed-loop clients: completions and chat, streamed or not, n up to 3, shared prefixes, stop strings and
logprobs now and then. A `--disconnect` share of them hang up: a stream after a few events, a plain request
after a few milliseconds. Targets: no 5xx, every stream that was not hung up on ends with a finish reason for
each choice and [DONE], nothing running or waiting and no KV block held afterwards, and resident memory flat
after warm-up (the first tenth of the requests). Exit status 0 when every target holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.experiments.server import Server
from bench.host import rss_mib
from bench.reliability.common import Tally, metric_values, settle, verdict

WORDS = ("alpha", "river", "stone", "quiet", "engine", "paper", "orbit", "candle", "forest", "signal", "tiger",
         "velvet", "harbor", "prism", "meadow", "copper")
PREFIXES = tuple(" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(120)) for i in range(6))
RSS_GROWTH_LIMIT_MIB = 64.0  # "flat": what is left after allocator noise and the caches' warm-up
COUNTERS = ("pagedserve:num_preemptions_total", "pagedserve:request_failure_total",
            "pagedserve:generation_tokens_total")


@dataclass(frozen=True)
class SoakPlan:
    requests: int
    concurrency: int
    disconnect: float
    seed: int


def random_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request of a random shape."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 150)))
    text = f"{rng.choice(PREFIXES)} {words}" if rng.random() < 0.3 else words
    body: dict[str, Any] = {"max_tokens": rng.randint(1, 96), "temperature": rng.choice([0.0, 0.8]),
                            "n": rng.choice([1, 1, 1, 1, 2, 3]), "stream": rng.random() < 0.7,
                            "ignore_eos": rng.random() < 0.5}
    if rng.random() < 0.1:
        body["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.5:
        return "/v1/completions", {**body, "prompt": text, **({"logprobs": 2} if rng.random() < 0.1 else {})}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}


async def run_one(session: aiohttp.ClientSession, url: str, rng: random.Random, plan: SoakPlan,
                  tally: Tally) -> None:
    path, body = random_request(rng)
    hang_up = rng.random() < plan.disconnect
    try:
        if body["stream"]:
            await _stream(session, url + path, body, rng.randint(0, 4) if hang_up else None, tally)
        else:
            await _plain(session, url + path, body, rng.uniform(0.001, 0.03) if hang_up else None, tally)
    except (TimeoutError, aiohttp.ClientError) as exc:
        tally.add("client error", f"{type(exc).__name__}: {exc} for {json.dumps(body)[:200]}")


async def _plain(session: aiohttp.ClientSession, url: str, body: dict[str, Any], hang_up_after: float | None,
                 tally: Tally) -> None:
    try:
        async with asyncio.timeout(hang_up_after), session.post(url, json=body) as resp:
            payload = await resp.read()
    except TimeoutError:
        tally.add("hung up (plain)")
        return
    _judge_plain(resp.status, payload, body["n"], tally)


def _judge_plain(status: int, payload: bytes, n: int, tally: Tally) -> None:
    if status >= 500:
        tally.add("5xx", f"{status} {payload[:200]!r}")
    elif status != 200:
        tally.add(f"unexpected {status}", payload[:200].decode(errors="replace"))
    elif sum(1 for c in json.loads(payload)["choices"] if c["finish_reason"]) != n:
        tally.add("response without finish", payload[:200].decode(errors="replace"))
    else:
        tally.add("ok (plain)")


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any], hang_up_after: int | None,
                  tally: Tally) -> None:
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            _judge_plain(resp.status, await resp.read(), body["n"], tally)
            return
        events, finished, done = 0, set[int](), False
        async for line in resp.content:
            if hang_up_after is not None and events >= hang_up_after:
                resp.close()  # drop the connection mid-stream
                tally.add("hung up (stream)")
                return
            events, done = events + line.startswith(b"data: "), done or line.strip() == b"data: [DONE]"
            _note_event(line, finished, tally)
    _judge_stream(done, len(finished), body["n"], tally)


def _note_event(line: bytes, finished: set[int], tally: Tally) -> None:
    if not line.startswith(b"data: {"):
        return
    event = json.loads(line[6:])
    if "error" in event:
        kind = "5xx" if event["error"]["type"] == "server_error" or event["error"].get("code") in (
            "engine_failed", "engine_error") else "in-band error"
        tally.add(kind, json.dumps(event)[:200])
    finished.update(c["index"] for c in event.get("choices", ()) if c.get("finish_reason"))


def _judge_stream(done: bool, finished: int, n: int, tally: Tally) -> None:
    if done and finished == n:
        tally.add("ok (stream)")
    else:
        tally.add("stream without finish", f"[DONE] seen: {done}, choices finished: {finished} of {n}")


async def clients(url: str, plan: SoakPlan, tally: Tally, on_progress: Any) -> None:
    remaining = iter(range(plan.requests))
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=plan.concurrency * 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async def client(index: int) -> None:
            rng = random.Random(plan.seed * 1_000_003 + index)
            for done in remaining:
                await run_one(session, url, rng, plan, tally)
                on_progress(done + 1)

        await asyncio.gather(*(client(i) for i in range(plan.concurrency)))


async def soak(server: Server, plan: SoakPlan) -> tuple[list[str], bool]:
    tally, rss = Tally(), {"start": rss_mib(server.pid)}
    warm_at = max(1, plan.requests // 10)

    def progress(done: int) -> None:
        if done == warm_at:
            rss["after warm-up"] = rss_mib(server.pid)
        if done % max(1, plan.requests // 10) == 0:
            print(f"  {done}/{plan.requests} requests", flush=True)

    start = time.monotonic()
    await clients(server.url, plan, tally, progress)
    seconds = time.monotonic() - start
    async with aiohttp.ClientSession() as session:
        state = await settle(session, server.url)
        counters = await metric_values(session, server.url, COUNTERS)
    rss["end"] = rss_mib(server.pid)
    return report(plan, tally, state, rss, seconds, server.log_text(), counters)


def report(plan: SoakPlan, tally: Tally, state: Any, rss: dict[str, float], seconds: float, log: str,
           counters: dict[str, float]) -> tuple[list[str], bool]:
    growth = rss["end"] - rss.get("after warm-up", rss["start"])
    lines = [f"soak: {plan.requests} requests, concurrency {plan.concurrency}, {plan.disconnect:.0%} hang-ups, "
             f"seed {plan.seed}, {seconds:.1f} s ({plan.requests / seconds:.0f} requests/s)", *tally.lines(),
             "  server: " + ", ".join(f"{k.split(':')[1]} {v:.0f}" for k, v in counters.items()),
             f"  after: {state}",
             "  resident memory: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()),
             f"  tracebacks in the server log: {log.count('Traceback')}"]
    checks, ok = verdict({
        "0 5xx": tally.counts["5xx"] == 0,
        "0 streams without a finish": tally.counts["stream without finish"] == 0,
        "0 other failures": all(tally.counts[k] == 0 for k in tally.counts if k.startswith(("unexpected",
                                                                                              "client", "response"))),
        "nothing running or waiting, 0 KV blocks held": state.idle,
        f"resident memory flat after warm-up (grew {growth:.0f} MiB, limit {RSS_GROWTH_LIMIT_MIB:.0f})":
            growth < RSS_GROWTH_LIMIT_MIB,
        "no traceback in the server log": "Traceback" not in log,
    })
    return [*lines, *checks], ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--disconnect", type=float, default=0.2, help="share of requests hung up on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="h200", help="the sim backend's hardware profile")
    parser.add_argument("--num-blocks", type=int, default=384, help="KV blocks (few enough to preempt)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = SoakPlan(args.requests, args.concurrency, args.disconnect, args.seed)
    server_args = ["--backend", "sim", "--sim-profile", args.profile, "--num-blocks", str(args.num_blocks),
                   "--max-num-seqs", str(args.concurrency)]
    with Server(server_args) as server:
        lines, ok = asyncio.run(soak(server, plan))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
