"""Checks of the emulation itself (tests/cuda_emu/probe_kernels.cu): warp intrinsics follow CUDA's rules, and
the ThreadSanitizer build reports an unsynchronised shared-memory handoff."""

from __future__ import annotations

import numpy as np

from backends.cupy_backend.launch import Launch
from tests.cuda.emu_lib import EmuLib

THREADS, RESULTS = 64, 13


def _expected_warp_results() -> np.ndarray:
    t = np.arange(THREADS)
    lane = t % 32
    ballot = int(sum(1 << i for i in range(32) if i % 3 == 0))
    cols = [
        lane ^ 5,
        lane ^ 1,
        np.where(lane + 3 < 32, lane + 3, lane),
        np.where(lane % 8 + 3 < 8, lane + 3, lane),
        np.where(lane >= 2, lane - 2, lane),
        np.where(lane % 16 >= 2, lane - 2, lane),
        np.full(THREADS, 7),
        lane // 16 * 16 + 3,
        np.full(THREADS, np.uint32(ballot).view(np.int32)),
        np.ones(THREADS),
        np.ones(THREADS),
        2 * (lane ^ 3) + 1,
        (t + 32) % THREADS * 10,
    ]
    return np.stack(cols, axis=1).astype(np.int32)


def check_warp_intrinsics(lib: EmuLib) -> None:
    out = np.full((THREADS, RESULTS), -999, np.int32)
    lib.launch(Launch("emu_probe_warp", (1, 1, 1), (THREADS, 1, 1), THREADS * 4, "p"), [out])
    want = _expected_warp_results()
    bad = np.argwhere(out != want)
    assert bad.size == 0, f"thread {bad[0][0]} result {bad[0][1]}: got {out[tuple(bad[0])]}, want {want[tuple(bad[0])]}"
    print(f"warp intrinsics: {out.size} results match")


def run_race(lib: EmuLib) -> None:
    """Not a check by itself: under ThreadSanitizer the caller expects a data race report."""
    out = np.zeros(1, np.int32)
    lib.launch(Launch("emu_probe_race", (1, 1, 1), (32, 1, 1), 0, "p"), [out])
