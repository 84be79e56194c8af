"""Small byte-level BPE GGUF files whose ``tokenizer.ggml.pre`` is Llama 3's ``llama-bpe`` or Qwen2's ``qwen2``,
with the ids Hugging Face ``transformers`` gives for a set of varied texts.

For each name this trains a byte-level BPE vocabulary with the ``tokenizers`` library's BpeTrainer (about 800
tokens and their merges, on TRAINING below, split as Llama 3 splits: so Qwen2's vocabulary holds numbers of two and
three digits too, which its one-digit split must not reach), writes it as ``<name>.gguf``
with the ``gguf`` package's writer as llama.cpp's converter writes a "gpt2" vocabulary (tokens spelled in GPT-2's
byte alphabet, three control tokens, the merges, no tensors), then loads the file with transformers' own GGUF
support (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``: transformers 5.25 knows both names, in
``integrations/gguf/gguf_tokenizer_mapping.py``, and builds a Split of Hugging Face's regex then a ByteLevel)
and records in ``reference.json`` the ids it gives for each of TEXTS (no special tokens added; the control
tokens' spellings in a text are matched as themselves).

Two differences between transformers' GGUF tokenizer and llama.cpp, and how they are handled:

* ignore_merges. llama.cpp's Llama 3 group takes a word the vocabulary holds whole, without merging (as Llama 3's
  published tokenizer.json says, ``"ignore_merges": true``); transformers' GGUF tokenizer (a GPT2Tokenizer) merges
  it. Each vocabulary gets one token no merge reaches (`` zqxzqx``, WITNESS); for ``llama-bpe`` the reference ids
  come from transformers' tokenizer with ``model.ignore_merges = True`` set, and the ids it gives as loaded are
  recorded too, where they differ (only the witness text).
* The contractions. Hugging Face writes them ``(?i:'s|'t|...)``; the regex engine's case folding makes ``'ſ``
  (long s) a contraction there, while llama.cpp spells them ``'[sS]|'[tT]|...`` and keeps ``'ſt`` one word. The
  texts avoid that character; the test checks llama.cpp's split of it separately.

The test (tests/golden/test_pretokenizers.py) loads each GGUF with pagedserve's tokenizer and needs none of this
script's packages. Run it by hand from the repository root (transformers 5.25, tokenizers 0.23, gguf 0.19;
nothing is downloaded)::

    HF_HUB_OFFLINE=1 /work/refvenv/bin/python tests/golden/pretokenizers/make_reference.py

It takes a few seconds and writes the GGUF files (about 21 kB each) and reference.json beside itself; with the
same versions it rewrites them byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import gguf
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
# Hugging Face's regexes, as Llama 3's and Qwen2's tokenizer.json write them (transformers' own copies)
HF_SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
IGNORE_MERGES = {"llama-bpe": True, "qwen2": False}  # llama.cpp's per group
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1000
WITNESS = " zqxzqx"  # a word whose whole token no merge makes: splits only without ignore_merges

TRAINING = """\
Hello, world! I'm here; you're there. They've gone, we'll see, he'd say it's fine. DON'T SHOUT, I'M LISTENING.
The quick brown fox jumps over the lazy dog 12345 times in 2024, at 3.14159 rad/s, costs $1,234.56 (about 7%).
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 12345 67890 1234567890 and phone +1-555-0100.
CamelCaseWords, snake_case_names, kebab-case-names, ALLCAPS, MiXeD cAsE, iPhone, McDonald's.
Punctuation runs: !!! ??? ... --- *** ==> <=> ;; :: ## @@ %% ^^ && || // \\\\ [] {} () <> ~~ `` ''
def main(argv):
    for i in range(10):
        print(f"value {i}: {argv[i]!r}")  # comment
    return 0


if __name__ == "__main__":
\tsys.exit(main(sys.argv))
Line one.
Line two.\r
\r
Indented    with    spaces   and\ttabs\t\there.
Naïve café, Straße, façade, résumé, Ελληνικά γράμματα, русский текст, 日本語のテキスト, 中文字符, 한국어 문장.
Emoji: 😀 🎉 👍🏽 👨‍👩‍👧 ✨ 🚀🚀🚀 ❤️
Fullwidth ４５６ digits, Arabic-Indic ١٢٣ digits, superscript ² and fraction ½.
"""
TEXTS = [
    "Hello, world! I'm fine; you're late, they've gone, we'll see, he'd say it's HERE'S and DON'T.",
    "Contractions in caps: 'S 'T 'RE 'VE 'M 'LL 'D, mixed: 'Re 'Ve 'Ll, and doubled: it's's",
    "12345 and 1234567890, 3.14159, -42, 1,000,000, 007, 2024-06-01T12:30:00Z",
    "CamelCaseWords and snake_case_names and ALLCAPS and iPhone15Pro",
    "!!! ??? ... --- ***  ==> <=> ;; a.b,c!d?e",
    "line one\nline two\r\n\n\nindented:\n    four spaces\n\ttab\t\there\n",
    "trailing spaces   ",
    "   leading spaces",
    "a  b   c    d     e",
    "\n\n\n",
    "    ",
    "",
    "Naïve café, Straße, Ελληνικά, русский текст, 日本語のテキスト, 中文字符, 한국어",
    "emoji: 😀🎉👍🏽 👨‍👩‍👧 ✨ 🚀🚀🚀",
    "def f(x):\n    return x**2  # square\n\n\nprint(f(12))\n",
    "Mixed123Numbers456 and ４５６ fullwidth and ١٢٣ arabic-indic and ² ½",
    "e\u0301 combining accent, ﬁ ligature, \u00a0no-break space, zero\u200bwidth",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "words never seen: xylophonic quizzaciously 98765432109876",
    WITNESS,
    f"as in{WITNESS}, again{WITNESS}{WITNESS}",
]
PACKAGES = ("transformers", "tokenizers", "gguf")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (how byte-level vocabularies spell their tokens)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def spelled(text: str) -> str:
    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in text.encode("utf-8"))


def train() -> tuple[list[str], list[str]]:
    """A vocabulary (control tokens first, WITNESS last) and merges learnt on TRAINING, split as Llama 3 splits."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(HF_SPLITS["llama-bpe"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=CONTROL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TRAINING] * 3, trainer=trainer)
    saved = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(saved["vocab"], key=saved["vocab"].__getitem__)
    merges = [" ".join(m) if isinstance(m, list) else m for m in saved["merges"]]
    witness = spelled(WITNESS)
    assert witness not in tokens and all(a + b != witness for a, b in (m.split(" ") for m in merges))
    return [*tokens, witness], merges


def write_gguf(name: str, tokens: list[str], merges: list[str]) -> Path:
    """The vocabulary as llama.cpp's converter writes a byte-level BPE one (no tensors: a tokenizer-only file)."""
    path = HERE / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny {name} tokenizer")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(name)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in CONTROL else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference(name: str, path: Path) -> dict[str, Any]:
    """transformers' ids for TEXTS from the GGUF (with llama.cpp's ignore_merges where its group has it)."""
    tok = AutoTokenizer.from_pretrained(str(HERE), gguf_file=path.name)
    backend = tok.backend_tokenizer
    pre = json.loads(backend.to_str())["pre_tokenizer"]
    split = pre["pretokenizers"][0]
    assert pre["type"] == "Sequence" and split["type"] == "Split" and split["pattern"]["Regex"] == HF_SPLITS[name]
    as_loaded = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    backend.model.ignore_merges = IGNORE_MERGES[name]
    ids = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    for text, got in zip(TEXTS, ids, strict=True):
        assert tok.decode(got) == text, (text, tok.decode(got))
    differ = {t: a for t, a, b in zip(TEXTS, as_loaded, ids, strict=True) if a != b}
    assert set(differ) == ({WITNESS, TEXTS[-1]} if IGNORE_MERGES[name] else set()), differ
    return {
        "gguf": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "vocab_size": len(tok.get_vocab()),
        "pre_tokenizer": pre,
        "ignore_merges": IGNORE_MERGES[name],
        "cases": [{"text": t, "ids": i} for t, i in zip(TEXTS, ids, strict=True)],
        "transformers_as_loaded": [{"text": t, "ids": i} for t, i in differ.items()],
    }


def main() -> None:
    out: dict[str, Any] = {
        "generated_by": "tests/golden/pretokenizers/make_reference.py",
        "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
        "witness": WITNESS,
        "files": {},
    }
    for name in HF_SPLITS:
        tokens, merges = train()
        out["files"][name] = reference(name, write_gguf(name, tokens, merges))
        print(name, len(tokens), "tokens", len(merges), "merges", (HERE / f"{name}.gguf").stat().st_size, "bytes")
    (HERE / "reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
