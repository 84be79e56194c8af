"""The request fuzzer: thousands of requests generated from the server's own request schemas (valid ones and
mutations of them) and over a hundred hand-written protocol-level cases, sent while a greedy canary request
checks that its output never changes. Targets: no 5xx, every error OpenAI's error JSON, every stream ended
with [DONE], the canary identical every time, nothing left running and no Traceback in the server's log.

    python -m bench.reliability.fuzz [--cases 5000] [--seed S] [--backend sim] [--url URL]

Without --url it starts its own `pagedserve serve` (with an API key, so that the key check is fuzzed too).
Exit status 0 only when every target holds; the first offending cases are printed, rebuildable from --seed."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

from bench.experiments.server import Server
from bench.reliability.fuzz_bodies import request_gen
from bench.reliability.fuzz_canary import run_canary
from bench.reliability.fuzz_cases import WEIGHTS, Case, CaseMaker
from bench.reliability.fuzz_client import judge, send
from bench.reliability.fuzz_report import ProtocolTally, Summary, Tally, render
from bench.reliability.fuzz_state import logged_exceptions, settled_state
from bench.reliability.fuzz_wire import Exchange, exchange, problems
from bench.reliability.protocol_cases import ProtocolCase, protocol_cases

PROGRESS_EVERY = 1000


@dataclass(frozen=True)
class Options:
    cases: int = 5000
    seed: int = 1
    backend: str = "sim"
    url: str | None = None  # a running server instead of one of our own
    api_key: str | None = None
    concurrency: int = 12
    timeout_s: float = 60.0  # per generated case
    protocol_timeout_s: float = 5.0  # per protocol case: silence this long is `no-answer`
    canary_interval_s: float = 0.2
    show: int = 5  # offending generated cases printed
    exclude: tuple[str, ...] = ()  # generated case kinds left out
    protocol: bool = True
    progress: bool = False


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.reliability.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=Options.cases, help="generated cases to send")
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--backend", default=Options.backend, help="of the server started (without --url)")
    parser.add_argument("--url", help="fuzz this running server instead of starting one")
    parser.add_argument("--api-key", help="the running server's API key (with --url)")
    parser.add_argument("--concurrency", type=int, default=Options.concurrency, help="requests in flight")
    parser.add_argument("--show", type=int, default=Options.show, help="offending generated cases to print")
    parser.add_argument("--exclude", nargs="*", default=[], choices=sorted(WEIGHTS), help="case kinds left out")
    parser.add_argument("--no-protocol", dest="protocol", action="store_false", help="skip the protocol cases")
    args = parser.parse_args(argv)
    return Options(args.cases, args.seed, args.backend, args.url, args.api_key, args.concurrency,
                   show=args.show, exclude=tuple(args.exclude), protocol=args.protocol, progress=True)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    summary = asyncio.run(fuzz(opts, opts.url.rstrip("/"))) if opts.url else _against_own_server(opts)
    print(render(summary))
    return 0 if summary.passed else 1


def _against_own_server(opts: Options) -> Summary:
    key = secrets.token_hex(16)
    with Server(["--backend", opts.backend, "--api-key", key]) as server:
        summary = asyncio.run(fuzz(dataclasses.replace(opts, api_key=key), server.url))
        tracebacks = logged_exceptions(server.log_text())
    return dataclasses.replace(summary, target=f"{server.url} (own server, {opts.backend} backend)",
                               tracebacks=tracebacks)


async def fuzz(opts: Options, base_url: str) -> Summary:
    """Every generated case, then every protocol case, with the canary running all along."""
    async with _session(opts) as session, _session(opts) as canary_session:
        model = await served_model(session, base_url)
        maker = CaseMaker(request_gen(model), model, {k: w for k, w in WEIGHTS.items() if k not in opts.exclude})
        stop = asyncio.Event()
        canary = asyncio.create_task(run_canary(canary_session, base_url, stop, opts.canary_interval_s))
        try:
            generated = await run_generated(session, base_url, maker.cases(opts.seed, opts.cases), opts)
            protocol = await run_protocol(base_url, opts) if opts.protocol else None
        finally:
            stop.set()
        log = await canary
        state = await settled_state(session, base_url)
    return Summary(base_url, opts.seed, generated, protocol, log, state, None)


def _session(opts: Options) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    return aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=opts.concurrency),
                                 timeout=aiohttp.ClientTimeout(total=None))


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url + "/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


async def run_generated(session: aiohttp.ClientSession, base_url: str, cases: Iterable[Case],
                        opts: Options) -> Tally:
    tally, pending = Tally(opts.show), iter(cases)

    async def worker() -> None:
        for case in pending:  # shared by the workers: each takes the next case
            answer = await send(session, base_url, case, opts.timeout_s)
            tally.add(case, answer, judge(case, answer))
            if opts.progress and tally.sent % PROGRESS_EVERY == 0:
                print(f"  {tally.sent} / {opts.cases} generated cases", file=sys.stderr)

    await asyncio.gather(*(worker() for _ in range(opts.concurrency)))
    return tally


async def run_protocol(base_url: str, opts: Options) -> ProtocolTally:
    """Every protocol case, each on its own connection, some at once."""
    url = URL(base_url)
    host, port = url.host or "127.0.0.1", url.port or 80
    chosen = protocol_cases(f"{host}:{port}", opts.api_key)
    limit = asyncio.Semaphore(opts.concurrency)

    async def one(case: ProtocolCase) -> Exchange:
        async with limit:
            return await exchange(host, port, case, opts.protocol_timeout_s)

    tally = ProtocolTally()
    for case, result in zip(chosen, await asyncio.gather(*(one(c) for c in chosen)), strict=True):
        tally.add(case, result, problems(case, result))
    return tally


if __name__ == "__main__":
    sys.exit(main())
