"""Overload: five times as many clients as the server can hold, none of them backing off.

    python -m bench.reliability.overload [--factor 5] [--seconds 20] [--max-num-seqs 16] [--max-waiting 16]

The server (sim backend, cpu profile: steps of tens of milliseconds) holds `max_num_seqs` running plus
`max_waiting` queued requests; `factor` times that many clients stream requests in a closed loop, retrying
`--retry-after-s` after a refusal (0.1 s by default: much sooner than the Retry-After they are given).
Meanwhile a prober asks /health every 100 ms. Targets: every refusal is 503
`queue_full` in OpenAI error JSON with Retry-After; no other 5xx; every admitted request finishes; /health
answers 200 throughout; the engine is idle afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.experiments.server import Server
from bench.reliability.common import Tally, settle, verdict
from bench.stats import pct

MAX_TOKENS = 32
BODY = {"prompt": "Tell me about the sea", "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True)
class OverloadPlan:
    clients: int
    seconds: float
    retry_after_s: float


async def client(session: aiohttp.ClientSession, url: str, plan: OverloadPlan, deadline: float, tally: Tally,
                 ttfts: list[float]) -> None:
    while time.monotonic() < deadline:
        start = time.monotonic()
        async with session.post(url + "/v1/completions", json=BODY) as resp:
            if resp.status != 200:
                _judge_refusal(resp.status, dict(resp.headers), await resp.read(), tally)
                await asyncio.sleep(plan.retry_after_s)
                continue
            await _read_stream(resp, start, tally, ttfts)


def _judge_refusal(status: int, headers: dict[str, str], body: bytes, tally: Tally) -> None:
    try:
        error = json.loads(body)["error"]
        shaped = set(error) == ERROR_KEYS and headers.get("Content-Type", "").startswith("application/json")
    except (ValueError, KeyError, TypeError):
        error, shaped = {}, False
    if status == 503 and shaped and error.get("code") == "queue_full" and headers.get("Retry-After"):
        tally.add("refused: 503 queue_full")
    else:
        tally.add(f"other {status}", body[:200].decode(errors="replace"))


async def _read_stream(resp: aiohttp.ClientResponse, start: float, tally: Tally, ttfts: list[float]) -> None:
    first, done = None, False
    async for line in resp.content:
        if first is None and line.startswith(b"data: {"):
            first = time.monotonic() - start
        if line.startswith(b"data: {") and "error" in json.loads(line[6:]):
            tally.add("in-band error", line[:200].decode(errors="replace"))
        done = done or line.strip() == b"data: [DONE]"
    tally.add("admitted and finished" if done else "admitted, no [DONE]")
    if first is not None:
        ttfts.append(first)


async def prober(session: aiohttp.ClientSession, url: str, deadline: float, tally: Tally,
                 latencies: list[float]) -> None:
    while time.monotonic() < deadline:
        start = time.monotonic()
        async with session.get(url + "/health") as resp:
            tally.add(f"/health {resp.status}")
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(0.1)


async def overload(url: str, plan: OverloadPlan) -> tuple[list[str], bool]:
    tally, ttfts, health = Tally(), list[float](), list[float]()
    deadline = time.monotonic() + plan.seconds
    connector = aiohttp.TCPConnector(limit=plan.clients + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(prober(session, url, deadline, tally, health),
                             *(client(session, url, plan, deadline, tally, ttfts) for _ in range(plan.clients)))
        state = await settle(session, url)
    return report(plan, tally, ttfts, health, state)


def report(plan: OverloadPlan, tally: Tally, ttfts: list[float], health: list[float], state: object
           ) -> tuple[list[str], bool]:
    counts = tally.counts
    finished = counts["admitted and finished"]
    lines = [f"overload: {plan.clients} clients for {plan.seconds:g} s, retrying {plan.retry_after_s:g} s after a "
             f"refusal", *tally.lines(),
             f"  admitted: {finished / plan.seconds:.1f} requests/s ({finished * MAX_TOKENS / plan.seconds:.0f}"
             " output tokens/s)",
             f"  admitted TTFT p50 {pct(ttfts, 0.5) * 1e3:.0f} ms, p99 {pct(ttfts, 0.99) * 1e3:.0f} ms",
             f"  /health latency p50 {pct(health, 0.5) * 1e3:.1f} ms, p99 {pct(health, 0.99) * 1e3:.1f} ms, "
             f"max {max(health) * 1e3:.1f} ms", f"  after: {state}"]
    checks, ok = verdict({
        "refusals are 503 queue_full JSON with Retry-After, no other status": not any(
            k.startswith("other") for k in counts),
        "every admitted request finished, no in-band error": counts["admitted, no [DONE]"] == 0
        and counts["in-band error"] == 0 and counts["admitted and finished"] > 0,
        "some requests were refused (the server really was overloaded)": counts["refused: 503 queue_full"] > 0,
        "/health answered 200 throughout": set(k for k in counts if k.startswith("/health")) == {"/health 200"},
        "idle afterwards": getattr(state, "idle", False),
    })
    return [*lines, *checks], ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factor", type=float, default=5.0, help="clients per request the server can hold")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-waiting", type=int, default=16)
    parser.add_argument("--retry-after-s", type=float, default=0.1, help="a refused client's wait")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = OverloadPlan(round(args.factor * (args.max_num_seqs + args.max_waiting)), args.seconds, args.retry_after_s)
    server_args = ["--backend", "sim", "--sim-profile", "cpu", "--max-num-seqs", str(args.max_num_seqs),
                   "--max-waiting-requests", str(args.max_waiting)]
    with Server(server_args) as server:
        lines, ok = asyncio.run(overload(server.url, plan))
        tracebacks = server.log_text().count("Traceback")
    print("\n".join([*lines, f"  tracebacks in the server log: {tracebacks}"]))
    return 0 if ok and tracebacks == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
