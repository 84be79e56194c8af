"""What a second thread that has run backend steps, and still lives, costs the step thread's steps.

libgomp keeps a team of OpenMP workers for each thread that runs a parallel region, while that thread lives.
With more of them than cores it throttles the spinning at every barrier to a few rounds (GOMP_SPINCOUNT or
not), so the step's threads sleep and wake at each of its ~300 barriers. The server once calibrated its
step-cost model on a pool thread that lived on (service/app/own_thread.py now runs it on a thread that ends).

    python -m bench.openmp_teams [--steps 60]

Prints the median 16-row decode step (default model, gguf weights) by stage, the steps run on one thread:
first with no other thread having run steps, then while another thread that ran five steps is still alive.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from backends.manual_batch import SeqState, make_batch
from backends.model.loader import load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.fused_step import STAGES
from backends.numpy_backend.native.weights import STORED_TYPES
from backends.numpy_backend.process_env import reexec_with_defaults

T = TypeVar("T")
ROWS, CONTEXT, BLOCK = 16, 256, 16


def on_new_thread(fn: Callable[[], T]) -> T:
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def median_step(backend: NumpyBackend, steps: int) -> dict[str, float]:
    """ms: the whole step and the fused step's stages, medians over `steps` decode steps of ROWS sequences."""
    per_seq = CONTEXT // BLOCK + 1
    seqs = [SeqState(blocks=list(range(i * per_seq, (i + 1) * per_seq)), tokens=[7] * (CONTEXT - 1))
            for i in range(ROWS)]
    batch = make_batch(seqs, [[11]] * ROWS, BLOCK)
    fused = backend.forward.fused_step
    assert fused is not None, "the fused C step did not build"
    rows = []
    for _ in range(steps):
        output = backend.execute(batch)
        rows.append([output.timings["forward"], *fused.last_seconds])
    medians = np.median(np.array(rows), axis=0) * 1e3
    return dict(zip(("forward", *STAGES), (float(v) for v in medians), strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    reexec_with_defaults("bench.openmp_teams")
    backend = NumpyBackend(load_model(stored=STORED_TYPES))
    backend.init_cache(ROWS * (CONTEXT // BLOCK + 1), BLOCK)
    alone = on_new_thread(lambda: median_step(backend, args.steps))
    release = threading.Event()
    other = threading.Thread(target=lambda: (median_step(backend, 5), release.wait()))
    other.start()
    beside = on_new_thread(lambda: median_step(backend, args.steps))
    release.set()
    other.join()
    print(f"{ROWS}-row decode step, ms (medians of {args.steps}): forward " + " ".join(STAGES))
    for name, row in (("alone", alone), ("beside a living team", beside)):
        print(f"{name:>21}: " + " ".join(f"{v:7.1f}" for v in row.values()))


if __name__ == "__main__":
    main()
