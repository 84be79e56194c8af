"""Named scheduler presets, chosen with `--preset` (or `preset` in [service], or PAGEDSERVE_PRESET).

A preset is a set of scheduler settings applied just above the defaults: any setting given explicitly (file,
environment or flag) overrides the preset's value. The values come from the frontier experiment in
docs/PERFORMANCE.md ("Experiments"): `latency` for interactive chat (lowest p99 time to first token at a
moderate load, with short steps), `throughput` for batch jobs (the most output tokens per second under a
saturating load). `itl_target_ms` comes from the itl-target experiment: 50 ms keeps a chat's stream steady
while prompts are prefilled beside it; a batch job does not watch its streams, so prefill takes the whole
budget (0, off) and the CPU's largest, most efficient steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

PRESETS: Mapping[str, Mapping[str, int]] = MappingProxyType({
    "latency": MappingProxyType({"max_num_seqs": 32, "max_num_batched_tokens": 2048, "itl_target_ms": 50}),
    "throughput": MappingProxyType({"max_num_seqs": 256, "max_num_batched_tokens": 8192, "itl_target_ms": 0}),
})
