"""Results as text (for the terminal) and JSON (for files)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec

from bench.loadgen.crosscheck import CrossCheck
from bench.loadgen.metrics import Stats, Summary

RULE = "=" * 60


def _num(value: float, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def format_summary(s: Summary) -> str:
    rows = [
        ("Load", s.label),
        ("Successful requests", str(s.completed)),
        ("Failed requests", str(s.failed) + (f"  {s.errors}" if s.errors else "")),
        ("Duration (s)", _num(s.duration_s)),
        ("Prompt tokens", str(s.input_tokens)),
        ("Output tokens", f"{s.output_tokens}  (counted from {', '.join(sorted(s.token_source)) or '-'})"),
        ("Request throughput (req/s)", _num(s.request_throughput)),
        ("Output token throughput (tok/s)", _num(s.output_throughput)),
        ("Total token throughput (tok/s)", _num(s.total_token_throughput)),
    ]
    if s.slo is not None and s.goodput is not None:
        rows.append((f"Goodput (req/s, {s.slo.text()})", f"{_num(s.goodput)}  ({s.good_requests} requests)"))
    lines = [RULE, *(f"{k + ':':<38}{v}" for k, v in rows)]
    for name, stats in (("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("ITL", s.itl_ms), ("E2E", s.e2e_ms)):
        lines.append(_stats_line(name, stats))
    lines.append(f"{'Stalls:':<12}ITL p99 / TPOT p50 {_num(stall_ratio(s))}  (1 is a steady stream; a prompt "
                 "prefilled beside the others raises it)")
    lines.append(RULE)
    return "\n".join(lines)


def stall_ratio(s: Summary) -> float:
    """How much longer the worst gaps between tokens (ITL p99) are than a stream's typical pace (TPOT p50)."""
    return s.itl_ms.p99 / s.tpot_ms.p50 if s.tpot_ms.p50 else math.nan


def _stats_line(name: str, st: Stats) -> str:
    parts = "  ".join(f"{k} {_num(getattr(st, k))}" for k in ("mean", "std", "p50", "p90", "p95", "p99"))
    return f"{name + ' (ms):':<12}{parts}  (n={st.count})"


def format_cross_check(check: CrossCheck) -> str:
    if not check.checks:
        return f"cross-check: the server exports none of the latency histograms ({check.note or 'not found'})"
    lines = ["cross-check against the server's /metrics histograms (ms; server = histogram_quantile):"]
    for c in check.checks:
        qs = "  ".join(f"p{q.q * 100:g} {_num(q.bench_ms)} vs {_num(q.server_ms)}{'' if q.consistent else ' !'}"
                       for q in c.quantiles)
        verdict = "consistent" if c.consistent else "INCONSISTENT"
        lines.append(f"  {c.metric:<5} {qs}  cdf gap {_num(c.cdf_gap, 3)}  n={c.bench_count}/{c.server_count:g}"
                     f"  {verdict}")
    if check.missing:
        lines.append(f"  not exported by the server: {', '.join(check.missing)}")
    return "\n".join(lines)


def to_builtins(value: Any) -> Any:
    """Plain JSON-able values (dataclasses and Structs become dicts; NaN becomes null)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def write_json(path: str | Path, payload: Any) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2) + b"\n")
    return out
