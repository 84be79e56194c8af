"""The throughput/latency frontier: max_num_seqs and token-budget sweeps under a chat load and a batch load,
and the two presets (`--preset latency`, `--preset throughput`) swept over concurrency.

    python -m bench.experiments.frontier [--scale 1] [--no-doc] [--no-progress]

Chat load: Poisson arrivals at a moderate rate (what an interactive service sees); the figure of merit is p99
TTFT. Batch load: many closed-loop clients keeping the server saturated; the figure of merit is output tokens/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.experiments.common import (
    SIM_H200,
    Point,
    Provenance,
    Run,
    Setup,
    parser,
    publish,
    run_points,
    save,
    setup_of,
)
from bench.experiments.doc import table
from bench.loadgen.metrics import Summary
from bench.loadgen.plot import plot_frontier
from bench.loadgen.spec import Bounds, LoadShape
from bench.loadgen.workloads import Lengths, RandomWorkload
from service.config.settings import PRESETS

KEY = "frontier"
COMMAND = "python -m bench.experiments.frontier"
WORKLOAD = RandomWorkload(Lengths(256, "lognormal", 1.0, 2048), Lengths(64, "lognormal", 1.0, 512), seed=0)
BASE_SEQS, BASE_BUDGET = 64, 2048
SEQS = (8, 16, 32, 64, 128, 256)
BUDGETS = (256, 512, 2048, 8192)
PRESET_CONCURRENCY = (4, 16, 64, 128)


@dataclass(frozen=True)
class Load:
    name: str
    shape: LoadShape
    requests: int


CHAT = Load("chat", LoadShape(rate=20.0, seed=1), 100)
BATCH = Load("batch", LoadShape(concurrency=128), 192)


@dataclass(frozen=True)
class Config:
    max_num_seqs: int
    budget: int

    @property
    def name(self) -> str:
        return f"seqs {self.max_num_seqs}, budget {self.budget}"

    def args(self) -> tuple[str, ...]:
        return (*SIM_H200, "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(self.budget))


def configs() -> list[Config]:
    found = [Config(s, BASE_BUDGET) for s in SEQS] + [Config(BASE_SEQS, b) for b in BUDGETS]
    return list(dict.fromkeys(found))  # the base configuration is in both sweeps: run it once


def run_knobs(setup: Setup) -> dict[tuple[Config, str], Point]:
    """One server per configuration, measured under each load in turn."""
    points = {}
    for config in configs():
        runs = [Run(f"{config.name}, {load.name} load", WORKLOAD, load.shape,
                    Bounds(setup.count(load.requests), None, warmup=8)) for load in (CHAT, BATCH)]
        for load, point in zip((CHAT, BATCH), run_points(config.args(), runs, setup), strict=True):
            points[(config, load.name)] = point
    return points


def preset_requests(concurrency: int) -> int:
    return max(2 * concurrency, 64)


def run_presets(setup: Setup) -> dict[tuple[str, int], Point]:
    points = {}
    for preset in PRESETS:
        runs = [Run(f"--preset {preset}, concurrency {c}", WORKLOAD, LoadShape(concurrency=c),
                    Bounds(setup.count(preset_requests(c)), None, warmup=min(c, 8))) for c in PRESET_CONCURRENCY]
        for c, point in zip(PRESET_CONCURRENCY, run_points((*SIM_H200, "--preset", preset), runs, setup),
                            strict=True):
            points[(preset, c)] = point
    return points


def best(knobs: dict[tuple[Config, str], Point]) -> tuple[Config, Config]:
    """(lowest p99 TTFT under the chat load, highest output tokens/s under the batch load)."""
    chat = {c: p.measurement.summary for (c, load), p in knobs.items() if load == CHAT.name}
    batch = {c: p.measurement.summary for (c, load), p in knobs.items() if load == BATCH.name}
    latency = min(chat, key=lambda c: (chat[c].ttft_ms.p99, chat[c].tpot_ms.p99))
    throughput = max(batch, key=lambda c: batch[c].output_throughput)
    return latency, throughput


def _row(config: Config, chat: Summary, batch: Summary) -> tuple[object, ...]:
    return (config.max_num_seqs, config.budget, chat.ttft_ms.p50, chat.ttft_ms.p99, chat.tpot_ms.p99,
            chat.failed, batch.output_throughput, batch.ttft_ms.p99, batch.tpot_ms.p99)


def knob_table(knobs: dict[tuple[Config, str], Point]) -> str:
    rows = [_row(c, knobs[(c, CHAT.name)].measurement.summary, knobs[(c, BATCH.name)].measurement.summary)
            for c in configs()]
    headers = ("max_num_seqs", "token budget", "chat: TTFT p50", "chat: TTFT p99", "chat: TPOT p99",
               "chat: errors", "batch: out tok/s", "batch: TTFT p99", "batch: TPOT p99")
    return table(headers, rows)


def preset_table(presets: dict[tuple[str, int], Point]) -> str:
    rows = []
    for (preset, c), p in presets.items():
        s = p.measurement.summary
        rows.append((preset, c, s.output_throughput, s.ttft_ms.p50, s.ttft_ms.p99, s.tpot_ms.p50, s.tpot_ms.p99))
    headers = ("preset", "concurrency", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99")
    return table(headers, rows, [False, *([True] * 6)])


def _overload(presets: dict[tuple[str, int], Point]) -> str:
    c = PRESET_CONCURRENCY[-1]
    lat, thr = (presets[(name, c)].measurement.summary for name in ("latency", "throughput"))
    return (f"at concurrency {c}, TPOT p99 {lat.tpot_ms.p99:.1f} ms against {thr.tpot_ms.p99:.1f} ms for "
            f"`throughput`, for a TTFT p99 of {lat.ttft_ms.p99:,.0f} ms against {thr.ttft_ms.p99:,.0f} ms and "
            f"{lat.output_throughput:,.0f} against {thr.output_throughput:,.0f} output tokens/s.")


def _preset_text(name: str) -> str:
    values = PRESETS[name]
    return f"`max_num_seqs` {values['max_num_seqs']}, `max_num_batched_tokens` {values['max_num_batched_tokens']}"


def report(knobs: dict[tuple[Config, str], Point], presets: dict[tuple[str, int], Point],
           info: dict[str, object]) -> str:
    latency, throughput = best(knobs)
    return f"""### The frontier: max_num_seqs, token budget, and the presets

```
{COMMAND}
pagedserve serve --preset latency        # or --preset throughput; explicit settings override a preset's
```

Sim backend, `h200` profile, real clock, default KV pool (2 GiB), prefix caching on (the random prompts share
nothing). Prompts log-normal (median 256 tokens, sigma 1, cap 2048), outputs log-normal (median 64, sigma 1,
cap 512), `ignore_eos`, seed 0, `/v1/completions` streamed. One server per configuration, measured under each
of two loads in turn, each after 8 warm-up requests:

- **chat**: Poisson arrivals at {CHAT.shape.rate:g} requests/s (seed 1), {CHAT.requests} measured requests;
  figure of merit p99 TTFT.
- **batch**: {BATCH.shape.concurrency} closed-loop clients, {BATCH.requests} measured requests; figure of
  merit output tokens/s.

Sweeps: `max_num_seqs` in {", ".join(map(str, SEQS))} at a {BASE_BUDGET}-token budget, and the budget
(`max_num_batched_tokens`) in {", ".join(map(str, BUDGETS))} at `max_num_seqs` {BASE_SEQS}. Latencies in ms.

{knob_table(knobs)}

Best by the rules above in this run: lowest chat p99 TTFT **{latency.name}**; highest batch throughput
**{throughput.name}**.

**Presets** (`service/config/settings.py`), fixed from this experiment's runs (the table above is one of them; on this
shared machine neighbouring configurations swap places from run to run, so a preset is a round choice from the
good region, not a single run's winner):

- `latency` (interactive chat): {_preset_text("latency")}. Under the chat load, 16-32 sequences at a
  2048-token budget gave the lowest p99 TTFT of the sweep (budgets of 256-512 split long prompts over several
  steps; more sequences make every step longer). When more than 32 requests are in flight it queues the rest
  instead of slowing everyone's tokens: {_overload(presets)}
- `throughput` (batch jobs): {_preset_text("throughput")}. As many sequences per step as the load offers, and
  whole prompts in one step: under saturation the per-step overhead is shared by the most tokens.

Each preset swept over closed-loop concurrency (one server per preset; requests: 2x the concurrency, at
least 64). Up to concurrency 16 both presets run the same batches (every request admitted, prompts in one step),
so the differences between their rows there are this machine's run-to-run noise:

{preset_table(presets)}

Plot: `docs/results/{KEY}.png` (output throughput against p99 TTFT and p99 TPOT: the knob sweeps under the
batch load, and each preset over concurrency). Results: `docs/results/{KEY}.json`.

{Provenance.line(info)}
"""


def plot(knobs: dict[tuple[Config, str], Point], presets: dict[tuple[str, int], Point], setup: Setup) -> None:
    def batch(c: Config) -> Summary:
        return knobs[(c, BATCH.name)].measurement.summary

    series = {
        f"max_num_seqs sweep (batch load, budget {BASE_BUDGET})": [(f"{s}", batch(Config(s, BASE_BUDGET)))
                                                                    for s in SEQS],
        f"budget sweep (batch load, {BASE_SEQS} seqs)": [(f"{b}", batch(Config(BASE_SEQS, b))) for b in BUDGETS],
    }
    for preset in PRESETS:
        series[f"--preset {preset}, C = {', '.join(map(str, PRESET_CONCURRENCY))}"] = [
            (f"C={c}", presets[(preset, c)].measurement.summary) for c in PRESET_CONCURRENCY]
    plot_frontier(series, setup.out_dir / f"{KEY}.png", "throughput/latency frontier (sim h200, real clock)")


def main(argv: Sequence[str] | None = None) -> int:
    setup = setup_of(parser(__doc__ or "").parse_args(argv))
    provenance = Provenance(COMMAND)
    knobs, presets = run_knobs(setup), run_presets(setup)
    info = provenance.finish()
    save(setup, KEY, {"experiment": KEY, "provenance": info, "workload": WORKLOAD,
                      "presets": {k: dict(v) for k, v in PRESETS.items()},
                      "knobs": [p.record() for p in knobs.values()],
                      "preset_points": [p.record() for p in presets.values()]})
    plot(knobs, presets, setup)
    text = report(knobs, presets, info)
    publish(setup, KEY, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
