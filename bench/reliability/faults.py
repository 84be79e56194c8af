"""Fault drills: every kind of injected fault under concurrent load, and what the clients and the server saw.

    python -m bench.reliability.faults [--requests 400] [--concurrency 16] [--seed 0]

One server per kind (sim backend, cpu profile), `--concurrency` clients, one choice per request, the fault
on every 25th step up to the 250th (the load takes about 300):
  step_error           passing faults: each failed step is re-run in halves, every half succeeds, nobody fails
  step_error, no re-run  (--failed-step-retry-s 0) failed requests == the sequences of the failed steps, as the
                       server logged each one; every failure is a 500 `engine_error` or an in-band error naming
                       the injected fault
  bad_token            one request per fired fault fails ("outside the vocabulary"), its neighbours finish
  slow_step:0.2        nobody fails; it only costs time
  poison@40,80,..      (by request, not step) exactly the poisoned requests fail, one per poison, whatever
                       batch they shared
Then, each on a server of its own:
  hang:4@10            (stall_report_s 1) /health 503 "degraded" within stall_report_s + 1 s of the last token,
                       200 again once the step returns; nobody fails
  step_error%100       /health 503 within 10 s of the first failure (degraded, then unhealthy once 5 steps in a
                       row have failed and the engine gives up)
  hang@10              /health turns 503 within step_timeout_s + 1 s of the last token, every open stream ends
                       with 503 `engine_failed`, and the process exits with status 3
After each non-fatal drill a new request succeeds, /health is 200 and nothing is left running or held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.experiments.server import Server
from bench.reliability.common import settle, verdict

SERVER = ("--backend", "sim", "--sim-profile", "cpu", "--max-num-seqs", "16")
STEP_FAILED = re.compile(r"engine step \d+ failed \((\w+)\); failing its (\d+) sequences: .*?on step (\d+)")
ANY_STEP_FAILED = re.compile(r"engine step \d+ failed \(\w+\); failing its")  # logged with a traceback
CLEARED = "every part succeeded when re-run"
HANG_TIMEOUT_S = 2.0


@dataclass
class Seen:
    """What the clients saw."""

    ok: int = 0
    failed_by_step: Counter[int] = field(default_factory=Counter)  # injected step number -> failed requests
    failures: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    last_token: float = 0.0


async def request(session: aiohttp.ClientSession, url: str, i: int, seen: Seen) -> None:
    body = {"prompt": f"drill {i} " * (1 + i % 7), "max_tokens": 24, "stream": i % 2 == 0, "ignore_eos": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        if body["stream"] and resp.status == 200:
            await _read_stream(resp, seen)
        else:
            _judge(resp.status, await resp.read(), seen)


async def _read_stream(resp: aiohttp.ClientResponse, seen: Seen) -> None:
    error = None
    async for line in resp.content:
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            error = event.get("error", error)
            if any(choice.get("text") for choice in event.get("choices", ())):  # a token, not the abort notice
                seen.last_token = time.monotonic()
    if error is None:
        seen.ok += 1
    else:
        _failure(error, seen)


def _judge(status: int, payload: bytes, seen: Seen) -> None:
    if status == 200:
        seen.ok += 1
    elif status in (500, 503):
        _failure(json.loads(payload)["error"], seen)
    else:
        seen.unexpected.append(f"{status} {payload[:200]!r}")


def _failure(error: dict[str, str], seen: Seen) -> None:
    seen.failures.append(f"{error.get('code')}: {error['message']}")
    step = re.search(r"on step (\d+)", error["message"])
    if error.get("code") == "engine_error" and step is not None:
        seen.failed_by_step[int(step.group(1))] += 1


async def load(url: str, requests: int, concurrency: int, seen: Seen) -> None:
    queue = iter(range(requests))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def client() -> None:
            for i in queue:
                try:
                    await request(session, url, i, seen)
                except aiohttp.ClientError as exc:
                    seen.unexpected.append(f"{type(exc).__name__}: {exc}")

        await asyncio.gather(*(client() for _ in range(concurrency)))


async def after_drill(url: str) -> tuple[bool, str]:
    """A new request succeeds, /health is 200 and the engine is idle."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json={"prompt": "after", "max_tokens": 4}) as resp:
            ok = resp.status == 200
        async with session.get(url + "/health") as health:
            ok = ok and health.status == 200
        state = await settle(session, url)
    return ok and state.idle, str(state)


def logged_steps(log: str) -> dict[int, int]:
    """Injected step number -> sequences the server failed with it, from its log."""
    return {int(step): int(count) for _, count, step in STEP_FAILED.findall(log)}


async def drill(kind: str, spec: str, args: argparse.Namespace) -> tuple[list[str], bool]:
    seen = Seen()
    retry = ["--failed-step-retry-s", "0"] if kind == "step_error, no re-run" else []
    with Server([*SERVER, *retry, "--sim-faults", spec, "--sim-seed", str(args.seed)]) as server:
        await load(server.url, args.requests, args.concurrency, seen)
        healthy, state = await after_drill(server.url)
        log = server.log_text()
    kinds = Counter(f.split(":")[0] for f in seen.failures)
    where = "sequences" if kind == "poison" else "steps"
    lines = [f"{kind} on {spec.count(',') + 1} {where}: {seen.ok} ok, {len(seen.failures)} failed {dict(kinds)}, "
             f"{len(seen.unexpected)} unexpected; after: {state}"]
    checks = {"no unexpected answer": not seen.unexpected, "a new request succeeds, /health 200, idle": healthy,
              "no traceback but the logged step failures": log.count("Traceback") == len(ANY_STEP_FAILED.findall(log))}
    checks.update(_kind_checks(kind, seen, log))
    marks, ok = verdict(checks)
    return [*lines, *marks], ok


def _kind_checks(kind: str, seen: Seen, log: str) -> dict[str, bool]:
    if kind == "step_error":
        return {"nobody failed": not seen.failures,
                "every failed step was re-run in parts and cleared": log.count(CLEARED) == 10}
    if kind == "poison":
        poisoned = [f for f in seen.failures if "injected poison" in f]
        return {"exactly the poisoned requests failed, one per poison": len(poisoned) == len(seen.failures) ==
                len(POISONED)}
    if kind == "step_error, no re-run":
        return {"failed requests == the failed steps' sequences, step by step":
                bool(seen.failures) and dict(seen.failed_by_step) == logged_steps(log),
                "every failure is the injected one": all("injected step_error" in f for f in seen.failures)}
    if kind == "bad_token":
        fired = log.count("outside the vocabulary")  # one log line per request failed
        return {"one request per bad token, named as such": bool(seen.failures) and len(seen.failures) == fired
                and all("outside the vocabulary" in f for f in seen.failures)}
    return {"nobody failed": not seen.failures}


async def hang_drill(args: argparse.Namespace) -> tuple[list[str], bool]:
    seen = Seen()
    spec = "hang@10"  # mid-way through the first requests' 24 tokens
    with Server([*SERVER, "--sim-faults", spec, "--step-timeout-s", str(HANG_TIMEOUT_S)]) as server:
        loading = asyncio.create_task(load(server.url, args.concurrency, args.concurrency, seen))
        unhealthy_after, _ = await _first_503(server.url, lambda: seen.last_token)
        await loading
        code = await asyncio.to_thread(_wait_exit, server)
        log = server.log_text()
    failed = Counter(f.split(":")[0] for f in seen.failures)
    lines = [f"{spec} (step_timeout_s {HANG_TIMEOUT_S:g}): /health 503 {unhealthy_after:.2f} s after the last "
             f"token; {seen.ok} ok, failures {dict(failed)}; exit status {code}"]
    marks, ok = verdict({
        f"/health 503 within step_timeout_s + 1 s ({HANG_TIMEOUT_S + 1:g} s)": unhealthy_after <= HANG_TIMEOUT_S + 1,
        "every request in flight ended with 503 engine_failed": set(failed) == {"engine_failed"}
        and not seen.unexpected,
        "the process exited with status 3": code == 3,
        "the cause was logged once": log.count("CRITICAL") == 1,
    })
    return [*lines, *marks], ok


async def stall_drill(args: argparse.Namespace) -> tuple[list[str], bool]:
    """A step held for 4 s, well under the watchdog's limit: reported as stalled, then healthy again."""
    seen, spec = Seen(), "hang:4@10"
    with Server([*SERVER, "--sim-faults", spec, "--stall-report-s", "1"]) as server:
        loading = asyncio.create_task(load(server.url, args.concurrency, args.concurrency, seen))
        degraded_after, body = await _first_503(server.url, lambda: seen.last_token)
        await loading
        healthy, state = await after_drill(server.url)
    lines = [f"{spec} (stall_report_s 1): /health 503 {degraded_after:.2f} s after the last token, saying {body}; "
             f"{seen.ok} ok, {len(seen.failures)} failed; after: {state}"]
    marks, ok = verdict({"/health 503 degraded within stall_report_s + 1 s (2 s)": degraded_after <= 2.0
                         and '"degraded"' in body, "nobody failed": not seen.failures and not seen.unexpected,
                         "a new request succeeds, /health 200, idle": healthy})
    return [*lines, *marks], ok


async def failing_drill(args: argparse.Namespace) -> tuple[list[str], bool]:
    """Every step fails: how soon /health stops sending traffic here."""
    seen, spec = Seen(), "step_error%100"
    first_failure: list[float] = []

    def failed_at() -> float:
        return first_failure[0] if first_failure else float("inf")

    with Server([*SERVER, "--sim-faults", spec]) as server:
        loading = asyncio.create_task(load(server.url, args.concurrency * 4, args.concurrency, seen))
        watching = asyncio.create_task(_first_failure(seen, first_failure))
        after, body = await _first_503(server.url, failed_at)
        await loading
        watching.cancel()
    lines = [f"{spec}: /health 503 {after:.2f} s after the first failure, saying {body}; {seen.ok} ok, "
             f"{len(seen.failures)} failed"]
    marks, ok = verdict({"/health 503 within 10 s of the first failure": after <= 10.0,
                         "nobody succeeded": seen.ok == 0})
    return [*lines, *marks], ok


async def _first_failure(seen: Seen, at: list[float]) -> None:
    while not seen.failures:
        await asyncio.sleep(0.005)
    at.append(time.monotonic())


async def _first_503(url: str, since: Callable[[], float], timeout: float = 30.0) -> tuple[float, str]:
    """Seconds from `since()` to /health's first 503 (inf if it never came), and what it said."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.get(url + "/health") as health:
                if health.status == 503:
                    return time.monotonic() - since(), (await health.text())
            await asyncio.sleep(0.02)
    return float("inf"), ""


def _wait_exit(server: Server, timeout: float = 15.0) -> int | None:
    deadline = time.monotonic() + timeout
    while server.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.returncode


def on_steps(fault: str, every: int = 25, last: int = 250) -> str:
    """The fault on every `every`-th step up to `last`: all inside the drill's load (~300 steps), none after it,
    so the request sent afterwards meets no fault."""
    return ",".join(f"{fault}@{step}" for step in range(every, last + 1, every))


POISONED = range(40, 400, 40)  # sequence ids: with one choice a request, the 40th, 80th, ... request
DRILLS = (("step_error", on_steps("step_error")), ("step_error, no re-run", on_steps("step_error")),
          ("bad_token", on_steps("bad_token")), ("slow_step", on_steps("slow_step:0.2")),
          ("poison", ",".join(f"poison@{i}" for i in POISONED)))


async def all_drills(args: argparse.Namespace) -> tuple[list[str], bool]:
    lines: list[str] = []
    ok = True
    for kind, spec in DRILLS:
        more, passed = await drill(kind, spec, args)
        lines, ok = [*lines, *more], ok and passed
    for health_drill in (stall_drill, failing_drill, hang_drill):
        more, passed = await health_drill(args)
        lines, ok = [*lines, *more], ok and passed
    return lines, ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    lines, ok = asyncio.run(all_drills(parse_args(argv)))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
