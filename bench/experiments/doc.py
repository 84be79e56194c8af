"""Each experiment owns one marked block inside the "## Experiments" section at the end of PERFORMANCE.md and
rewrites only that block; the section is created (with its introduction) the first time."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

SECTION = "## Experiments"
# blocks appear in this order
ORDER = ("intro", "batching", "kv-layout", "frontier", "prefix-caching", "cross-check", "itl-target", "scaling")
INTRO = """\
`pagedserve bench` is the load generator used here: a pure HTTP client for any OpenAI-compatible server
(this one, vLLM, llama.cpp's `llama-server`), streaming `/v1/completions` or `/v1/chat/completions`:

```
pagedserve bench --port 8000 --concurrency 16 --num-requests 200 --input-len 256 --output-len 128 --out run.json
pagedserve bench --sweep concurrency=1,4,16,64 --lengths lognormal --slo ttft=500ms,tpot=50ms --out sweep.json
pagedserve bench --rate 8 --burstiness 0.5 --duration 60 --endpoint chat --workload chat --turns 4
pagedserve bench --workload shared-prefix --num-prefixes 4 --prefix-len 1024 --endpoint chat
pagedserve bench --base-url http://127.0.0.1:8001 --served-model-name NAME --workload file --dataset p.jsonl
pagedserve bench --check-metrics ...      # compare with the server's /metrics histograms, same requests
```

Load: `--concurrency N` clients in a closed loop, or `--rate R` arrivals/s in an open loop (Poisson; gamma
with `--burstiness K`: < 1 burstier, > 1 more regular; `--concurrency` then caps requests in flight), after
`--warmup N` unmeasured requests, until `--num-requests` or `--duration` (requests in flight then finish and
count). Metrics follow vLLM's benchmark: TTFT to the first chunk with text; TPOT = (E2E - TTFT) / (output
tokens - 1) per request; ITL between text chunks; E2E to the end of the stream; mean, std, p50/p90/p95/p99;
request, output-token and total-token throughput over the run's wall time; goodput = requests/s meeting every
`--slo` bound; failures by kind (`HTTP 503`, `timeout`, `stream error: CODE`). Output tokens come from the
usage chunk (`stream_options.include_usage`), else from the tokenizer of `--model`. A sweep writes one JSON
with every point and, next to it, a PNG of output throughput against p99 TTFT and p99 TPOT.

Each experiment below is one command that starts its own server(s) on 127.0.0.1 (a `pagedserve serve`
subprocess per configuration), drives them with this load generator, writes its JSON and PNG into
`docs/results/`, and rewrites its own block of this section. All of them use the **sim backend** (no weights:
token ids from a hash, step time from the roofline cost model of `backends/sim_backend`) on the **real clock**,
so a step really takes its modelled time and everything the server does around it (scheduler, HTTP, SSE) is
measured as it is. The model shape is SmolLM2-135M. On the `h200` profile a decode step costs ~1.3 ms, almost
all of it the profile's fixed per-step overhead, so on this 2-vCPU shared machine the server's own CPU time per
sequence is a large part of each step: read the absolute numbers as this server on this host, and the ratios
between configurations as the result. The `cpu` profile models the NumPy backend on this machine; the `cpu`
rows below were run with its first calibration (~70 ms per decode step, prefill ~13 ms per token). Since
2026-12-04 it models the faster backend with C kernels (now ~20 ms per batch-1 decode step, ~1.7 ms per
prefill token)."""


def begin(key: str) -> str:
    return f"<!-- experiment:{key} -->"


def end(key: str) -> str:
    return f"<!-- /experiment:{key} -->"


def update_block(doc: Path, key: str, body: str) -> None:
    """Replace (or insert, in ORDER) the block `key` of the Experiments section of `doc`."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Performance\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n"
    if key != "intro":
        text = _upsert(text, "intro", INTRO)
    doc.write_text(_upsert(text, key, body), encoding="utf-8")


def _upsert(text: str, key: str, body: str) -> str:
    block = f"{begin(key)}\n{body.strip()}\n{end(key)}"
    pattern = re.compile(re.escape(begin(key)) + r".*?" + re.escape(end(key)), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return _insert(text, key, block)


def _insert(text: str, key: str, block: str) -> str:
    later = ORDER[ORDER.index(key) + 1:] if key in ORDER else ()
    for other in later:
        at = text.find(begin(other))
        if at >= 0:
            return text[:at] + block + "\n\n" + text[at:]
    start = text.index(SECTION)
    nxt = re.search(r"^## ", text[start + len(SECTION):], re.MULTILINE)
    stop = start + len(SECTION) + nxt.start() if nxt else len(text)
    return text[:stop].rstrip("\n") + "\n\n" + block + "\n" + ("\n" + text[stop:] if nxt else "")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None) -> str:
    aligns = right if right is not None else [i > 0 for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---:" if r else "---" for r in aligns) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)
