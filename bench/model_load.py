"""Start-up cost of a model's formats: the time to open and load it and the resident memory the load adds, each
in a fresh process, against the bytes of weights it holds.

    python -m bench.model_load [--model PATH_OR_DIR ...] [--weights float32|gguf] [--repeats 3]

Every model given (a GGUF file or a Hugging Face checkpoint directory; default: the default model's GGUF) is
loaded `--repeats` times, alternating, each in a new interpreter: open_model (header, config, tokenizer,
template) then load_model (the weights); the medians are printed, with the resident memory the load added
(VmRSS after minus before, the weights, tokenizer and template: what the server holds before its KV pool) as a
multiple of the weights' bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from backends.model.loader import default_model_path

_PROBE = """
import gc, json, re, pathlib, sys, time
rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', pathlib.Path('/proc/self/status').read_text()).group(1)) * 1024
from backends.model.loader import load_model, open_model
from backends.numpy_backend.native.weights import STORED_TYPES
before, start = rss(), time.perf_counter()
model = load_model(files=open_model(sys.argv[1])[1], stored=STORED_TYPES if sys.argv[2] == 'gguf' else ())
seconds = time.perf_counter() - start
gc.collect()
print(json.dumps({"seconds": seconds, "rss": rss() - before, "weights": model.weights.num_bytes}))
"""


def measure(model: str, weights: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _PROBE, model, weights], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="a GGUF file or checkpoint directory (repeatable)")
    parser.add_argument("--weights", choices=("float32", "gguf"), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    models = args.model or [str(default_model_path())]
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in models}
    for _ in range(args.repeats):
        for model in models:
            runs[model].append(measure(model, args.weights))
    print(f"weights {args.weights}, medians of {args.repeats} fresh processes")
    print("| model | load s | resident MiB | weights MiB | resident / weights |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for model, samples in runs.items():
        seconds, rss = (statistics.median(s[k] for s in samples) for k in ("seconds", "rss"))
        weights = samples[0]["weights"]
        print(f"| {model} | {seconds:.2f} | {rss / 2**20:.0f} | {weights / 2**20:.0f} | {rss / weights:.2f} |")


if __name__ == "__main__":
    main()
