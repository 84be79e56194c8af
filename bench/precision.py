"""What the fast CPU precision (or a float16 KV cache) costs in accuracy, against the exact precision over a
float32 cache, on a model (default: the default model) with its weights as stored:

    python -m bench.precision [--prompts 20] [--tokens 128] [--candidate fast | kv16 | fast-kv16] [--model GGUF]

- greedy agreement, batched: `--prompts` chat prompts decoded together (one batch, so every step has enough
  rows for the fast precision's tiles) for `--tokens` tokens in each precision; how many tokens agree before
  the first difference, per prompt, and over all;
- greedy agreement, alone: the same prompts each decoded on its own (decode steps of one row: the fast
  precision's 8-bit small steps);
- perplexity of bench/data/perplexity.txt (plain prose written for this purpose, about 1,060 tokens) in chunks
  of 64 tokens, each chunk's logits for every position from one step (the tiles); and again one token a step
  (the small steps).

The candidate (default: the fast precision) ships only if both perplexities are within 1 % of the exact ones.
For a fast candidate, prints the machine's fast paths (AMX tiles, 8-bit small steps, or neither: then fast is
exact, and fast over a float32 cache agrees with exact exactly).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.manual_batch import SeqState, make_batch
from backends.model.chat_template import NoChatTemplate
from backends.model.loader import LoadedModel, load_model
from backends.numpy_backend.backend import NumpyBackend
from backends.numpy_backend.native.cpu_tiers import AUTO, CHOICES
from backends.numpy_backend.native.matmul import NativeMatmul
from backends.numpy_backend.native.weights import STORED_TYPES
from kvpool import PagedKVCacheManager
from scheduler.config import SchedulerConfig
from scheduler.llm import LLM
from scheduler.params import SamplingParams

TEXT = Path(__file__).parent / "data" / "perplexity.txt"
CANDIDATES = {"fast": ("fast", "float32"), "kv16": ("exact", "float16"), "fast-kv16": ("fast", "float16")}
CHUNK, BLOCK = 64, 16
TOPICS = ("the water cycle", "how a bicycle stays upright", "the history of paper", "why the sky is blue",
          "how vaccines work", "the rules of chess", "photosynthesis", "how a compiler works", "volcanoes",
          "the French revolution", "how bread rises", "black holes", "the immune system", "how to plant a tree",
          "the printing press", "ocean tides", "how a refrigerator works", "the Roman empire", "honeybees",
          "how the internet routes packets", "glaciers", "the human heart", "electric motors", "coral reefs")


@dataclass(frozen=True)
class Agreement:
    matched: list[int]  # per prompt: tokens equal before the first difference
    length: int

    def lines(self) -> list[str]:
        full = sum(m == self.length for m in self.matched)
        total = sum(self.matched) / (self.length * len(self.matched))
        return [f"greedy agreement: {full}/{len(self.matched)} prompts identical for all {self.length} tokens; "
                f"tokens before the first difference: min {min(self.matched)}, median "
                f"{int(np.median(self.matched))}; {total:.1%} of all tokens precede any difference"]


def prompts(model: LoadedModel, count: int) -> list[list[int]]:
    """Chat prompts through the model's template; a model without one (a base model) gets the plain text."""
    return [prompt_ids(model, f"Explain {TOPICS[i % len(TOPICS)]}.") for i in range(count)]


def prompt_ids(model: LoadedModel, text: str) -> list[int]:
    tokenizer = model.files.tokenizer
    try:
        return tokenizer.encode(model.files.chat_template.render([{"role": "user", "content": text}]))
    except NoChatTemplate:
        return tokenizer.encode_prompt(text)


def greedy(backend: NumpyBackend, model: LoadedModel, prompt_ids: list[list[int]], tokens: int) -> list[list[int]]:
    longest = max(len(p) for p in prompt_ids) + tokens + 1
    kv = PagedKVCacheManager(len(prompt_ids) * -(-longest // BLOCK), BLOCK)
    backend.init_cache(kv.num_blocks, BLOCK)
    config = SchedulerConfig(max_num_seqs=len(prompt_ids), max_num_batched_tokens=4096)
    llm = LLM(config, kv, backend, model.files.tokenizer, max_model_len=longest)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [out.choices[0].token_ids for out in llm.generate(prompt_ids, params)]


def greedy_alone(backend: NumpyBackend, model: LoadedModel, prompt_ids: list[list[int]],
                 tokens: int) -> list[list[int]]:
    """greedy for each prompt on its own: decode steps of one row."""
    return [greedy(backend, model, [one], tokens)[0] for one in prompt_ids]


def agreement(a: list[list[int]], b: list[list[int]], tokens: int) -> Agreement:
    def prefix(x: list[int], y: list[int]) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))

    return Agreement([prefix(x, y) for x, y in zip(a, b, strict=True)], tokens)


def perplexity(backend: NumpyBackend, ids: list[int], chunk_size: int = CHUNK) -> float:
    """exp(mean negative log-likelihood) of each token given those before it, a chunk of `chunk_size` per step."""
    backend.init_cache(-(-len(ids) // BLOCK), BLOCK)
    seq, nll = SeqState(blocks=list(range(-(-len(ids) // BLOCK)))), 0.0
    for start in range(0, len(ids) - 1, chunk_size):
        chunk = ids[start : start + chunk_size]
        hidden = backend.forward.hidden_states(make_batch([seq], [chunk], BLOCK), backend.cache)  # adds the chunk
        logits = backend.forward.logits(hidden).astype(np.float64)
        targets = np.array(ids[start + 1 : start + 1 + len(chunk)])
        log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        nll += float((log_z[: len(targets)] - logits[np.arange(len(targets)), targets]).sum())
    return math.exp(nll / (len(ids) - 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--candidate", choices=CANDIDATES, default="fast",
                        help="what is compared with the exact precision over a float32 KV cache")
    parser.add_argument("--model", help="a GGUF file or checkpoint directory (default: the default model)")
    parser.add_argument("--cpu-isa", default=AUTO, choices=CHOICES, help="the C kernels' CPU tier, both sides")
    args = parser.parse_args(argv)
    model = load_model(args.model, stored=STORED_TYPES)
    exact = NumpyBackend(model, "auto", cpu_isa=args.cpu_isa)
    candidate = NumpyBackend(model, "auto", *CANDIDATES[args.candidate], cpu_isa=args.cpu_isa)
    if CANDIDATES[args.candidate][0] == "fast":
        print(f"fast precision: {NativeMatmul(fast=True, tier=exact.cpu_tier).fast_paths()}")
    ids = prompts(model, args.prompts)
    together = agreement(greedy(exact, model, ids, args.tokens), greedy(candidate, model, ids, args.tokens),
                         args.tokens)
    alone = agreement(greedy_alone(exact, model, ids, args.tokens), greedy_alone(candidate, model, ids, args.tokens),
                      args.tokens)
    text = model.files.tokenizer.encode(TEXT.read_text())
    changes = []
    for label, size in ((f"chunks of {CHUNK}", CHUNK), ("one token a step", 1)):
        ppl_exact, ppl_candidate = perplexity(exact, text, size), perplexity(candidate, text, size)
        changes.append(ppl_candidate / ppl_exact - 1)
        print(f"perplexity of {TEXT.name} ({len(text)} tokens), {label}: exact {ppl_exact:.4f}, {args.candidate} "
              f"{ppl_candidate:.4f} ({changes[-1]:+.3%})")
    met = all(abs(c) < 0.01 for c in changes)
    print("\n".join(["batched, " + together.lines()[0], "alone, " + alone.lines()[0],
                     f"target (perplexity within 1 %): {'met' if met else 'NOT met'}"]))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
