"""Slow and half-sent connections: each is let go in time, and a neighbour's stream does not notice them.

    python -m bench.reliability.slow_clients [--each 100] [--read-timeout-s 2] [--keepalive-timeout-s 5]

Against one server (sim backend, cpu profile), `--each` connections of every kind at once:
  silent        connects and sends nothing                     closed within read_timeout_s + 1 s
  trickle       a request line, then one header byte per 0.5 s  closed within read_timeout_s + 1 s of its start
  half body     headers for 1000 bytes of body, sends 100       408 `request_timeout` JSON, closed, in time
  idle          one full request, then nothing                  closed within keepalive_timeout_s + 1 s
Meanwhile a neighbour streams 64-token completions, one after another; its inter-chunk gaps are compared with
the same stream's before the attack. Targets: every connection let go in time (the half-sent ones with a 408
in OpenAI error JSON); the neighbour's requests all succeed, with gap p99 within 2x the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

from bench.experiments.server import Server
from bench.reliability.common import Tally, neighbour, verdict
from bench.stats import pct

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True)
class Limits:
    read_timeout_s: float
    keepalive_timeout_s: float


async def silent(conn: Streams, limits: Limits) -> tuple[float, bytes]:
    return await _until_closed(conn, time.monotonic())


async def trickle(conn: Streams, limits: Limits) -> tuple[float, bytes]:
    reader, writer = conn
    start = time.monotonic()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    feeding = asyncio.create_task(_feed(writer, b"X-Slow: " + b"a" * 1000))
    try:
        return await _until_closed(conn, start)
    finally:
        feeding.cancel()


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    for byte in data:
        writer.write(bytes([byte]))
        await asyncio.sleep(0.5)


async def half_body(conn: Streams, limits: Limits) -> tuple[float, bytes]:
    reader, writer = conn
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "' + b"a" * 88)
    return await _until_closed(conn, time.monotonic())


async def idle(conn: Streams, limits: Limits) -> tuple[float, bytes]:
    reader, writer = conn
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b'"status":"ready"}')
    return await _until_closed(conn, time.monotonic())


async def _until_closed(conn: Streams, since: float) -> tuple[float, bytes]:
    """Seconds from `since` until the server closed the connection, and what it sent meanwhile."""
    reader, _ = conn
    received = await reader.read()  # to EOF
    return time.monotonic() - since, received


Kind = Callable[[Streams, Limits], Awaitable[tuple[float, bytes]]]
KINDS: dict[str, tuple[Kind, Callable[[Limits], float]]] = {
    "silent": (silent, lambda lim: lim.read_timeout_s),
    "trickle": (trickle, lambda lim: lim.read_timeout_s),
    "half body": (half_body, lambda lim: lim.read_timeout_s),
    "idle": (idle, lambda lim: lim.keepalive_timeout_s),
}


async def attacker(url: URL, name: str, limits: Limits, tally: Tally, cap_s: float) -> None:
    kind, bound = KINDS[name]
    conn = await asyncio.open_connection(url.host, url.port)
    try:
        took, received = await asyncio.wait_for(kind(conn, limits), cap_s)
    except TimeoutError:
        tally.add(f"{name}: still open after {cap_s:g} s")
        return
    finally:
        conn[1].close()
    in_time = took <= bound(limits) + 1.0
    tally.add(f"{name}: closed {'in time' if in_time else 'late'}", None if in_time else f"after {took:.1f} s")
    if name == "half body" and _is_408_json(received):
        tally.add("half body: 408 JSON")
    elif name == "half body":
        tally.add("half body: other answer", received[:200].decode(errors="replace"))


def _is_408_json(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    try:
        return head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["code"] == "request_timeout"
    except (ValueError, KeyError, TypeError):
        return False



async def run(url: str, each: int, limits: Limits) -> tuple[list[str], bool]:
    tally, base, attacked = Tally(), list[float](), list[float]()
    cap = max(limits.read_timeout_s, limits.keepalive_timeout_s) + 10
    async with aiohttp.ClientSession() as session:
        await neighbour(session, url, time.monotonic() + 5, base, tally)
        attackers = [attacker(URL(url), name, limits, tally, cap) for name in KINDS for _ in range(each)]
        until = time.monotonic() + limits.keepalive_timeout_s + 2
        await asyncio.gather(neighbour(session, url, until, attacked, tally), *attackers)
    return report(tally, each, base, attacked)


def report(tally: Tally, each: int, base: list[float], attacked: list[float]) -> tuple[list[str], bool]:
    counts = tally.counts
    p99, p99_attacked = pct(base, 0.99), pct(attacked, 0.99)
    lines = [f"slow clients: {each} of each kind", *tally.lines(),
             f"  neighbour gaps: p50 {pct(base, 0.5) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms alone; "
             f"p50 {pct(attacked, 0.5) * 1e3:.0f} ms, p99 {p99_attacked * 1e3:.0f} ms under attack"]
    checks, ok = verdict({
        "every connection let go in time": all(counts[f"{name}: closed in time"] == each for name in KINDS),
        "every half-sent body answered 408 in OpenAI error JSON": counts["half body: 408 JSON"] == each,
        "the neighbour's requests all succeeded": set(k for k in counts if k.startswith("neighbour")) == {
            "neighbour: 200"},
        "the neighbour's gap p99 within 2x its p99 alone": p99_attacked <= 2 * p99,
    })
    return [*lines, *checks], ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--each", type=int, default=100, help="connections of each kind")
    parser.add_argument("--read-timeout-s", type=float, default=2.0)
    parser.add_argument("--keepalive-timeout-s", type=float, default=5.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    limits = Limits(args.read_timeout_s, args.keepalive_timeout_s)
    server_args = ["--backend", "sim", "--sim-profile", "cpu", "--read-timeout-s", str(limits.read_timeout_s),
                   "--keepalive-timeout-s", str(limits.keepalive_timeout_s)]
    with Server(server_args) as server:
        lines, ok = asyncio.run(run(server.url, args.each, limits))
        tracebacks = server.log_text().count("Traceback")
    print("\n".join([*lines, f"  tracebacks in the server log: {tracebacks}"]))
    return 0 if ok and tracebacks == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
