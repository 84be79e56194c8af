"""What the live dashboard's view of one engine step costs the engine, part by part, timed apart from serving.

    python -m bench.dashboard_view [--rows 64] [--blocks 8192] [--repeats 5000]

A real engine core over the sim backend (zero-cost steps) with `--rows` requests decoding in a pool of
`--blocks` blocks; after a few steps, each part of `scheduler/engine_view.py` that a step's view runs is timed on
the same plan: the rows' columns, the block counts, the whole view without and with its Detail (the block map,
each request's blocks, the queue), and the view's JSON. Prints microseconds per call (best of 5 runs).
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable
from typing import cast

import msgspec

from scheduler import engine_view
from scheduler.core import EngineCore
from scheduler.engine_view import KVCounts
from scheduler.output_processor import TokenizerLike
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest
from scheduler.step import SchedulerPlan


class Keeper:
    """A watcher that keeps the last view it is handed."""

    watching = True
    view: object = None

    def publish(self, event: str, view: object) -> None:
        self.view = view


def decoding_core(rows: int, blocks: int) -> tuple[EngineCore, SchedulerPlan, Keeper]:
    from service.app.assemble import build_parts  # noqa: PLC0415 - the model's tokenizer, read once, here
    from service.config.settings import load_config  # noqa: PLC0415

    config = load_config(None, {}, {"backend": "sim", "num_blocks": str(blocks), "max_num_seqs": str(rows)})
    parts = build_parts(config)
    tokenizer = cast(TokenizerLike, parts.files.tokenizer)
    core = EngineCore.for_backend(config.scheduler, parts.kv, parts.backend, tokenizer,
                                  max_model_len=parts.max_model_len)
    keeper = Keeper()
    core.views.watcher = keeper
    prompt = tuple(parts.files.tokenizer.encode("Hello, how does a paged KV cache share its blocks?"))
    for i in range(rows):
        core.add_request(EngineRequest(f"cmpl-{i:032x}", prompt, SamplingParams(max_tokens=1000, ignore_eos=True)))
    for _ in range(4):  # past the prefill: every row decodes
        plan = core.plan()
        assert plan.batch is not None
        core.commit(plan, parts.backend.execute(plan.batch), core.clock())
    return core, core.plan(), keeper


def microseconds(fn: Callable[[], object], repeats: int) -> float:
    return min(timeit.repeat(fn, number=repeats, repeat=5)) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5000)
    args = parser.parse_args()
    core, plan, keeper = decoding_core(args.rows, args.blocks)
    views, encoder = core.views, msgspec.json.Encoder()

    def view(detail: bool) -> Callable[[], None]:
        def build() -> None:
            views._last_detail = 0.0 if detail else time.monotonic() + 1e9  # due now, or not for a long while
            views._step_view(plan, 0.0, 0.001)
        return build

    view(False)()
    few = max(1, args.repeats // 50)  # for the O(blocks) parts
    parts: dict[str, tuple[Callable[[], object], int]] = {
        "rows' columns": (lambda: views._rows(plan), args.repeats),
        "block counts": (lambda: KVCounts.of(core.kv), args.repeats),
        "the view, no Detail": (view(False), args.repeats),
        "its JSON": (lambda: encoder.encode(keeper.view), args.repeats),
        "the view with its Detail": (view(True), few),
        "the block map alone": (core.kv.block_map, few),
    }
    print(f"{len(plan.seqs)} decode rows, {core.kv.num_blocks} blocks "
          f"(a Detail at most every {engine_view.DETAIL_INTERVAL_S * 1e3:g} ms):")
    for name, (fn, repeats) in parts.items():
        print(f"  {name:28s} {microseconds(fn, repeats):8.1f} us")
    view(False)()
    print(f"  a step record's JSON: {len(encoder.encode(keeper.view)):,} bytes")


if __name__ == "__main__":
    main()
