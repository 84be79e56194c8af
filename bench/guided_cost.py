"""What constrained decoding costs per token: decode steps of a batch following a 10-field JSON schema against
the same batch unconstrained, on the NumPy backend and the real model.

    python -m bench.guided_cost [--batch 16] [--repeats 3] [--model PATH] [--chat-template FILE]

--model: another GGUF than the default SmolLM2 (Gemma 3's vocabulary is 262,144 tokens to SmolLM2's 49,152;
the mask's cost grows with it). A model without a chat template gets the asks as completion prompts.

Each repeat runs the batch guided (greedy, a schema of 10 fields) and then unguided with each sequence held
to exactly the guided one's length (ignore_eos, max_tokens), so both runs have the same steps with the same
batch shapes; only the grammar differs. Every step is timed from plan to commit; decode-only steps are
compared. The masks are computed on their thread while the backend runs the forward pass, so the cost shows
as what sampling waits for them plus the engine's consuming of the tokens. Reported: per-step p50/p90 for each
mode, the p50 overhead as a share of the unguided step (= TPOT, one token per sequence per step), and the mask
thread's own time per step. Target: under 10 % of TPOT at batch 16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from backends.model.loader import LoadedModel, load_model, open_model
from backends.numpy_backend.backend import NumpyBackend
from backends.sampling import apply_allowed
from bench.stats import pct
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.core import EngineCore
from scheduler.guided import GuideFactory, GuideSpec
from scheduler.params import SamplingParams
from scheduler.request import EngineRequest

BLOCK = 16
FIELDS = ["name", "species", "age", "weight_kg", "color", "city", "owner", "vaccinated", "favorite_food", "notes"]
TYPES = ["string", "string", "integer", "number", "string", "string", "string", "boolean", "string", "string"]
SCHEMA = {"type": "object", "properties": {f: {"type": t} | ({"maxLength": 24} if t == "string" else {})
                                           for f, t in zip(FIELDS, TYPES, strict=True)},
          "required": FIELDS, "additionalProperties": False}


@dataclass
class Run:
    decode_steps: list[float]  # seconds per decode-only step
    lengths: list[int]  # output tokens per sequence


def prompts(model: LoadedModel, batch: int) -> list[list[int]]:
    template, tok = model.files.chat_template, model.files.tokenizer
    asks = [f"Describe pet number {i} as JSON with its name, species, age and more." for i in range(batch)]
    if template.source is None:
        return [tok.encode_prompt(a) for a in asks]
    return [tok.encode(template.render([{"role": "user", "content": a}])) for a in asks]


def run(core: EngineCore, backend: NumpyBackend, ids: list[list[int]],
        params: Callable[[int], SamplingParams]) -> Run:
    streams = [core.add_request(EngineRequest(f"r{i}-{time.monotonic_ns()}", tuple(p), params(i)))
               for i, p in enumerate(ids)]
    steps: list[float] = []
    while core.has_work:
        start = time.perf_counter()
        plan = core.plan()
        assert plan.batch is not None
        core.commit(plan, backend.execute(plan.batch), start)
        if plan.prefill_tokens == 0:
            steps.append(time.perf_counter() - start)
    return Run(steps, [len(s.take_finished().choices[0].token_ids) for s in streams])


def one_repeat(core: EngineCore, backend: NumpyBackend, ids: list[list[int]], spec: GuideSpec) -> tuple[Run, Run]:
    guided = run(core, backend, ids, lambda i: SamplingParams(temperature=0.0, max_tokens=200, guide=spec))
    plain = run(core, backend, ids,
                lambda i: SamplingParams(temperature=0.0, max_tokens=guided.lengths[i], ignore_eos=True))
    assert plain.lengths == guided.lengths
    return guided, plain


def report(name: str, steps: list[float]) -> float:
    p50 = pct(steps, 0.5)
    print(f"  {name:10s} decode steps {len(steps):4d}  p50 {p50 * 1e3:7.2f} ms  p90 {pct(steps, 0.9) * 1e3:7.2f} ms")
    return p50


def mask_seconds(guides: GuideFactory, spec: GuideSpec, batch: int, steps: int = 50) -> float:
    """The mask thread's time per step for `batch` fresh guides (their first masks, a worst case: the object
    opening has the most alternatives after it), without a backend step beside it."""
    gs = [guides.guide(spec) for _ in range(batch)]
    start = time.perf_counter()
    for _ in range(steps):
        guides.masks(gs, np.arange(batch, dtype=np.int32)).bits()
    return (time.perf_counter() - start) / steps


def walk_seconds(guides: GuideFactory, spec: GuideSpec, batch: int, tokens: list[int], repeats: int = 5
                 ) -> list[float]:
    """The mask thread's time for `batch` guides at each step of a valid answer (`tokens`), the fastest of
    `repeats` walks (a shared machine's noise only adds): inside a free string most of the vocabulary is
    allowed, the costly case, which the first mask (only '{"' allowed) does not show."""
    positions = np.arange(batch, dtype=np.int32)
    best = [float("inf")] * len(tokens)
    for _ in range(repeats):
        gs = [guides.guide(spec) for _ in range(batch)]
        for step, token in enumerate(tokens):
            start = time.perf_counter()
            guides.masks(gs, positions).bits()
            best[step] = min(best[step], time.perf_counter() - start)
            for guide in gs:
                guide.consume(token)
    return best


def sample_answer() -> dict[str, object]:
    """An answer the schema accepts, its strings a few words each."""
    values = {"string": "a few words here", "integer": 12, "number": 1.5, "boolean": True}
    return {field: values[kind] for field, kind in zip(FIELDS, TYPES, strict=True)}


def part_seconds(guides: GuideFactory, spec: GuideSpec, batch: int, vocab: int, tokens: list[int],
                 steps: int = 50) -> dict[str, float]:
    """The grammar's own work per step, each part alone (medians, seconds): starting the masks, masking a
    batch's logits with them, and the guides following one token each (along `tokens`, a valid answer)."""
    logits = np.random.default_rng(0).normal(size=(batch, vocab)).astype(np.float32)
    positions = np.arange(batch, dtype=np.int32)
    times: dict[str, list[float]] = {"start masks": [], "mask logits": [], "follow tokens": []}
    gs = [guides.guide(spec) for _ in range(batch)]
    for step in range(min(steps, len(tokens))):
        start = time.perf_counter()
        pending = guides.masks(gs, positions)
        times["start masks"].append(time.perf_counter() - start)
        pending.wait()
        start = time.perf_counter()
        apply_allowed(np, logits, pending)
        times["mask logits"].append(time.perf_counter() - start)
        start = time.perf_counter()
        for guide in gs:
            guide.consume(tokens[step])
        times["follow tokens"].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--chat-template", help="a Jinja file replacing the model's chat template")
    args = parser.parse_args(argv)
    model = load_model(files=open_model(args.model, args.chat_template)[1])
    print(f"{model.files.path.name}: vocabulary {model.files.config.vocab_size} tokens")
    backend = NumpyBackend(model)
    kv = PagedKVCacheManager(args.batch * 24, BLOCK)
    backend.init_cache(kv.num_blocks, BLOCK)
    guides = GuideFactory(model.files.tokenizer)
    core = EngineCore.for_backend(SchedulerConfig(max_num_seqs=args.batch), kv, backend, model.files.tokenizer,
                                  max_model_len=2048, guides=guides)
    spec = guides.compile("json_schema", SCHEMA, "bench")
    ids = prompts(model, args.batch)
    overheads = []
    for r in range(args.repeats):
        guided, plain = one_repeat(core, backend, ids, spec)
        print(f"repeat {r + 1}: batch {args.batch}, output tokens per sequence p50 "
              f"{statistics.median(guided.lengths)}")
        g50, p50 = report("guided", guided.decode_steps), report("unguided", plain.decode_steps)
        overheads.append((g50 - p50) / p50)
        print(f"  overhead at p50: {overheads[-1] * 100:+.1f} % of TPOT")
    print(f"median overhead over {args.repeats} repeats: {statistics.median(overheads) * 100:+.1f} % of TPOT "
          f"(target under 10 %)")
    print(f"mask thread alone, {args.batch} guides: {mask_seconds(guides, spec, args.batch) * 1e3:.2f} ms per step")
    answer = model.files.tokenizer.encode(json.dumps(sample_answer(), separators=(", ", ": ")))
    for batch in sorted({1, args.batch}):
        walk = walk_seconds(guides, spec, batch, answer)
        print(f"mask thread along an answer ({len(answer)} steps), {batch} guides: p50 {pct(walk, 0.5) * 1e3:.2f} ms, "
              f"p90 {pct(walk, 0.9) * 1e3:.2f} ms, max {max(walk) * 1e3:.2f} ms per step")
    parts = part_seconds(guides, spec, args.batch, model.files.config.vocab_size, answer)
    print("the grammar's own work per step: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in parts.items()))
    guides.close()


if __name__ == "__main__":
    main()
