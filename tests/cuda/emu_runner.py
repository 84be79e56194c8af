"""Runs named emulation cases in this process: `python -m tests.cuda.emu_runner LIBRARY CASE...`.

The tests start it as a subprocess with a timeout, because a faulty kernel can crash or deadlock the process
that runs it. Exit status 0 means every case matched its reference.
"""

from __future__ import annotations

import sys
import time

from tests.cuda.emu_cases import all_cases
from tests.cuda.emu_lib import EmuLib


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tests.cuda.emu_runner LIBRARY CASE...", file=sys.stderr)
        return 2
    lib, cases = EmuLib(argv[0]), all_cases()
    for name in argv[1:]:
        start = time.perf_counter()
        cases[name](lib)
        print(f"PASS {name} ({time.perf_counter() - start:.2f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
