"""SIGTERM under load: what finishes, what is cut short, and how the process ends.

    python -m bench.reliability.drain [--streams 32] [--drain-timeout-s 3]

The server (sim backend, cpu profile) serves `--streams` streams, half short (16 tokens) and half long (4000
tokens), and gets SIGTERM once every stream has begun. Meanwhile new requests and /health keep coming. Targets:
every short stream finishes normally; every long one ends, after the drain timeout, with a final error event
`shutting_down` and [DONE]; new requests and /health get 503 from the signal on; the process exits 0 within
the drain timeout plus a few seconds; no other status, no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.experiments.server import Server
from bench.reliability.common import Tally, verdict

SHORT, LONG = 16, 4000
EXIT_GRACE_S = 8.0  # past the drain: handlers write their last events, telemetry flushes, the listener closes


async def stream(session: aiohttp.ClientSession, url: str, max_tokens: int, started: asyncio.Event,
                 tally: Tally) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    kind = "short" if max_tokens == SHORT else "long"
    async with session.post(url + "/v1/completions", json=body) as resp:
        last = None
        async for line in resp.content:
            started.set()
            if line.startswith(b"data: {"):
                last = json.loads(line[6:])
    tally.add(f"{kind}: {_ending(last)}")


def _ending(event: dict[str, Any] | None) -> str:
    if event is None:
        return "no event"
    if "error" in event:
        return f"error {event['error']['code']}"
    choices = event.get("choices") or [{}]
    return f"finished {choices[0].get('finish_reason')}"


async def knock(session: aiohttp.ClientSession, url: str, until: float, tally: Tally) -> None:
    """New requests and health checks after the signal, until the server stops answering."""
    while time.monotonic() < until:
        try:
            async with session.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 2}) as resp:
                code = json.loads(await resp.read()).get("error", {}).get("code") if resp.status != 200 else ""
                tally.add(f"new request after the signal: {resp.status} {code}")
            async with session.get(url + "/health") as health:
                tally.add(f"/health after the signal: {health.status}")
        except aiohttp.ClientError:
            tally.add("connection refused after the signal (listener closed)")
            return
        await asyncio.sleep(0.2)


async def drain(server: Server, streams: int, drain_s: float) -> tuple[list[str], bool]:
    tally, started = Tally(), [asyncio.Event() for _ in range(streams)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        tasks = [asyncio.create_task(stream(session, server.url, SHORT if i % 2 else LONG, started[i], tally))
                 for i in range(streams)]
        await asyncio.gather(*(event.wait() for event in started))
        server.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.1)
        await asyncio.gather(knock(session, server.url, signalled + drain_s + EXIT_GRACE_S, tally), *tasks)
    code = await asyncio.to_thread(_wait_exit, server, signalled + drain_s + EXIT_GRACE_S)
    return report(tally, streams, code, time.monotonic() - signalled, drain_s, server.log_text())


def _wait_exit(server: Server, deadline: float) -> int | None:
    while server.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.returncode


def report(tally: Tally, streams: int, code: int | None, took: float, drain_s: float, log: str
           ) -> tuple[list[str], bool]:
    counts, half = tally.counts, streams // 2
    late = {k for k in counts if k.startswith(("new request", "/health"))}
    lines = [f"drain: {streams} streams, drain_timeout_s {drain_s:g}; exit status {code} {took:.1f} s after SIGTERM",
             *tally.lines()]
    checks, ok = verdict({
        "every short stream finished normally": counts["short: finished length"] == streams - half,
        "every long stream ended with a shutting_down error event": counts["long: error shutting_down"] == half,
        "after the signal: 503 shutting_down and /health 503 only": late <= {
            "new request after the signal: 503 shutting_down", "/health after the signal: 503"},
        f"exit status 0 within drain_timeout_s + {EXIT_GRACE_S:g} s": code == 0,
        "no traceback in the server log": "Traceback" not in log,
    })
    return [*lines, *checks], ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--drain-timeout-s", type=float, default=3.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_args = ["--backend", "sim", "--sim-profile", "cpu", "--max-num-seqs", str(args.streams),
                   "--num-blocks", "16384", "--drain-timeout-s", str(args.drain_timeout_s)]
    with Server(server_args) as server:
        lines, ok = asyncio.run(drain(server, args.streams, args.drain_timeout_s))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
