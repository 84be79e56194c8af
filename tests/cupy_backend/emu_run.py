"""Runs one end-to-end scenario in this process: `python -m tests.cupy_backend.emu_run LIBRARY MODEL SCENARIO`.

Started as a child process with a timeout by the tests; exit status 0 means the scenario passed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.cupy_backend.emu_scenarios import scenarios


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tests.cupy_backend.emu_run LIBRARY MODEL SCENARIO", file=sys.stderr)
        return 2
    library, model, name = Path(argv[0]), Path(argv[1]), argv[2]
    start = time.perf_counter()
    scenarios()[name](library, model)
    print(f"PASS {name} ({time.perf_counter() - start:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
