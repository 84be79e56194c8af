"""The decode kernels' policy table from a GPU run: which of plain and partitioned decode attention was faster
at each point of bench/gpu_check.py's `decode_sweep` section.

    python -m bench.decode_policy gpu_check.json [--out backends/cupy_backend/decode_policy.json]

Commit the table with the run's JSON (docs/results/gpu/) it came from; CupyBackend reads it at start-up
(backends/cupy_backend/decode_policy.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.cupy_backend.decode_policy import TABLE_PATH, DecodePolicy, Point


def policy_from_run(run: dict[str, Any], source: str) -> DecodePolicy:
    """The sweep's points as a policy; refuses a run whose sweep did not pass."""
    sweep = run.get("sections", {}).get("decode_sweep", {})
    if sweep.get("status") != "ok" or not sweep.get("points"):
        raise ValueError(f"{source} has no passing decode_sweep section")
    points = tuple(Point(p["batch"] * p["heads"], p["context"], p["head_dim"], bool(p["partitioned_wins"]))
                   for p in sweep["points"])
    return DecodePolicy(points, f"{sweep['device']} ({source})", sweep["dtype"], sweep["partition_size"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="bench/gpu_check.py's JSON output")
    parser.add_argument("--out", type=Path, default=TABLE_PATH, help=f"the table to write (default {TABLE_PATH})")
    args = parser.parse_args(argv)
    policy = policy_from_run(json.loads(args.run.read_text()), args.run.name)
    args.out.write_text(json.dumps(policy.to_json(), indent=1) + "\n")
    wins = sum(p.partitioned for p in policy.points)
    print(f"{args.out}: {len(policy.points)} points, partitioned faster at {wins}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
