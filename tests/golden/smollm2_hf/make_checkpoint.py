"""Write SmolLM2-135M-Instruct as a Hugging Face checkpoint directory with transformers, from the GGUF the
default-model package ships: the independent conversion tests/backends/test_hf_checkpoint.py checks pagedserve's
checkpoint loader against. Run by hand, in an environment with torch, transformers (5.x) and gguf:

    python tests/golden/smollm2_hf/make_checkpoint.py GGUF_FILE OUT_DIR

It writes OUT_DIR (float32 safetensors, config.json, generation_config.json, the tokenizer's files: transformers'
own conversion of the GGUF, which un-permutes Q and K to Hugging Face's row order), then copies the small files
beside this script and records in weights.json the sha256 of a few tensors as transformers wrote them (the test
rebuilds the weights from the GGUF without transformers and checks them against these) and the greedy
continuations transformers computes for the prompts in PROMPTS.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).parent
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json")
CHECKED = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
           "model.layers.0.self_attn.k_proj.weight", "model.layers.29.self_attn.k_proj.weight",
           "model.layers.0.mlp.down_proj.weight", "model.norm.weight")
PROMPTS = ("The capital of France is", "def fibonacci(n):")
NEW_TOKENS = 12


def main(gguf_file: Path, out: Path) -> None:
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    # a model loaded from a GGUF refuses save_pretrained: the same weights in a model built from its config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    state = model.state_dict()
    sums = {name: hashlib.sha256(state[name].contiguous().numpy().tobytes()).hexdigest() for name in CHECKED}
    runs = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            new = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1]:]
        runs.append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "greedy": new.tolist()})
    for name in SMALL_FILES:
        if (out / name).exists():
            shutil.copy(out / name, HERE / name)
    (HERE / "weights.json").write_text(json.dumps({"sha256": sums, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
