"""Big prompts cost their sender: a neighbour's stream while one client posts prompts of megabytes.

    python -m bench.reliability.big_prompts [--seconds 10] [--streams 4]

Against one server (sim backend, cpu profile, 4 MiB body limit), `--streams` neighbours stream 64-token
completions one after another; their gaps between chunks are measured alone, then while an attacker posts,
back to back, (a) 1.9 MB prompts (refused before tokenizing: they cannot fit the context whatever their
tokens), and (b) 600 KB prompts (under that bound: tokenized, on the tokenizer threads, then refused as too
long). Target: the neighbours' gap p99 under each attack stays within 2x their p99 alone; /health answers fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.experiments.server import Server
from bench.reliability.common import Tally, neighbour, verdict
from bench.stats import pct

ATTACKS = {"1.9 MB prompts": "word " * 380_000, "600 KB prompts": "word " * 120_000}


@dataclass(frozen=True)
class Attack:
    """Bodies posted to `path` back to back, one client per body."""

    path: str
    bodies: tuple[bytes, ...]


def prompt_attack(prompt: str) -> Attack:
    return Attack("/v1/completions", (json.dumps({"prompt": prompt, "max_tokens": 1}).encode(),))


async def attacker(session: aiohttp.ClientSession, url: str, until: float, data: bytes, tally: Tally) -> None:
    """Posts `data` (encoded once: the attacker's own cost is not the test) until `until`."""
    while time.monotonic() < until:
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            tally.add(f"attack answered {resp.status}")


async def prober(session: aiohttp.ClientSession, url: str, until: float, latencies: list[float]) -> None:
    while time.monotonic() < until:
        start = time.monotonic()
        async with session.get(url + "/health") as resp:
            await resp.read()
        latencies.append(time.monotonic() - start)
        await asyncio.sleep(0.05)


async def phase(url: str, seconds: float, streams: int, attack: Attack | None, tally: Tally
                ) -> tuple[list[float], list[float]]:
    """Gaps between the neighbours' chunks and /health's latencies, with `attack` going on (None: alone)."""
    gaps, health = list[float](), list[float]()
    until = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        work = [neighbour(session, url, until, gaps) for _ in range(streams)] + [prober(session, url, until, health)]
        if attack is not None:
            work += [attacker(session, url + attack.path, until, data, tally) for data in attack.bodies]
        await asyncio.gather(*work)
    return gaps, health


async def run(url: str, seconds: float, streams: int) -> tuple[list[str], bool]:
    tally, lines, checks = Tally(), [f"big prompts: {streams} neighbour streams, {seconds:g} s a phase"], {}
    alone, health = await phase(url, seconds, streams, None, tally)
    lines.append(gap_line("alone", alone, health))
    for attack, prompt in ATTACKS.items():
        gaps, health = await phase(url, seconds, streams, prompt_attack(prompt), tally)
        lines.append(gap_line(f"with {attack}", gaps, health))
        checks[f"with {attack}: gap p99 within 2x alone"] = pct(gaps, 0.99) <= 2 * pct(alone, 0.99)
    checks["every attack refused with 400"] = set(tally.counts) == {"attack answered 400"}
    marks, ok = verdict(checks)
    return [*lines, *tally.lines(), *marks], ok


def gap_line(label: str, gaps: list[float], health: list[float]) -> str:
    return (f"  {label:22s} gaps p50 {pct(gaps, 0.5) * 1e3:5.1f} ms, p99 {pct(gaps, 0.99) * 1e3:5.1f} ms, "
            f"max {max(gaps) * 1e3:6.1f} ms; /health p99 {pct(health, 0.99) * 1e3:.1f} ms")


def parse_args(argv: Sequence[str] | None = None, doc: str | None = __doc__) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--streams", type=int, default=4)
    return parser.parse_args(argv)


Run = Callable[[str, float, int], Coroutine[Any, Any, tuple[list[str], bool]]]  # (url, seconds, streams) -> lines, ok


def serve_attacks(argv: Sequence[str] | None, doc: str | None, server_args: list[str], run: Run) -> int:
    """A run's command: its flags, a server with `server_args`, the report; non-zero when a target failed."""
    args = parse_args(argv, doc)
    with Server(server_args) as server:
        lines, ok = asyncio.run(run(server.url, args.seconds, args.streams))
        tracebacks = server.log_text().count("Traceback")
    print("\n".join([*lines, f"  tracebacks in the server log: {tracebacks}"]))
    return 0 if ok and tracebacks == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    server_args = ["--backend", "sim", "--sim-profile", "cpu", "--max-body-bytes", str(4 * 1024 * 1024)]
    return serve_attacks(argv, __doc__, server_args, run)


if __name__ == "__main__":
    raise SystemExit(main())
