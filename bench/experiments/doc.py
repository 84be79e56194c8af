"""Each experiment owns one marked block inside the "## Experiments" section at the end of PERFORMANCE.md and
rewrites only that block; the section is created (with its introduction) the first time."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

SECTION = "## Experiments"
ORDER = ("batching", "kv-layout", "frontier", "prefix-caching", "cross-check")  # blocks appear in this order
INTRO = """\
Each experiment is one command that starts its own server(s) on 127.0.0.1 (a `pagedserve serve` subprocess per
configuration), drives them with `pagedserve bench`'s load generator over HTTP, writes its JSON and PNG into
`docs/results/`, and rewrites its own block below. All of them use the **sim backend** (no weights: token ids
from a hash, step time from the roofline cost model of `backends/sim_backend`) on the **real clock**, so a step
really takes its modelled time, and everything the server does around the step (scheduler, HTTP, SSE) is
measured as it is. The model shape is SmolLM2-135M; on the `h200` profile a decode step costs ~1.3 ms, almost
all of it the profile's fixed per-step overhead, so on this 2-vCPU shared machine the server's own CPU time per
sequence is a large part of each step: read the absolute numbers as this server on this host, and the ratios
between configurations as the result."""


def begin(key: str) -> str:
    return f"<!-- experiment:{key} -->"


def end(key: str) -> str:
    return f"<!-- /experiment:{key} -->"


def update_block(doc: Path, key: str, body: str) -> None:
    """Replace (or insert, in ORDER) the block `key` of the Experiments section of `doc`."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Performance\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{INTRO}\n"
    block = f"{begin(key)}\n{body.strip()}\n{end(key)}"
    pattern = re.compile(re.escape(begin(key)) + r".*?" + re.escape(end(key)), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = _insert(text, key, block)
    doc.write_text(text, encoding="utf-8")


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
