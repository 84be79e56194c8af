"""Build the model stack from an AppConfig: model files, backend, KV cache manager, the calibrated step-cost
model, then the engine (`pagedserve serve`, service/app/server.py) or the offline LLM (`pagedserve generate`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import cast

from backends.base import Backend
from backends.config import BackendConfig
from backends.model.loader import DEFAULT_MODEL_NAME, ModelFiles, open_model
from backends.registry import create_backend
from kvpool import KVCacheManager, KVSpec, StepDemand, kv_cache_manager_from_config, new_kv_cache_manager
from scheduler.calibration import calibrate
from scheduler.draft import DraftModel
from scheduler.engine import Engine
from scheduler.guided import GuideFactory
from scheduler.llm import LLM
from scheduler.output_processor import TokenizerLike
from scheduler.step_cost import StepCostModel
from service.config.settings import AppConfig, ConfigError
from telemetry.interface import EngineObserver

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelParts:
    files: ModelFiles
    backend: Backend
    kv: KVCacheManager
    max_model_len: int
    draft: DraftModel | None = None  # speculative_method "draft": the draft model, its backend and pool


def model_name(config: AppConfig) -> str:
    """What /v1/models lists and responses report: the first configured name, else the model's."""
    return model_names(config)[0]


def model_names(config: AppConfig) -> tuple[str, ...]:
    """Every name a request may give in "model": the configured ones (the first reported), else the model's."""
    if config.service.served_model_name:
        return config.service.served_model_name
    if config.backend.model is None:
        return (DEFAULT_MODEL_NAME,)
    path = Path(config.backend.model)
    return (path.name if path.is_dir() else path.stem,)  # a checkpoint directory's name ("Qwen2.5-0.5B") whole


def build_parts(config: AppConfig, files: ModelFiles | None = None) -> ModelParts:
    """Blocking (the weights load here): the server runs it in a worker thread. `files` skips re-reading
    the model's header and tokenizer when the caller already has them."""
    if files is None:
        _, files = open_model(config.backend.model, config.backend.chat_template)
    backend = create_backend(backend_config(config), files)
    max_len = config.scheduler.max_model_len or files.config.context_length
    kv, spec = build_kv(config, backend, max_len)
    backend.init_cache(kv.num_blocks, config.kv.block_size, kv.window_blocks)
    log_kv(config, kv, spec)
    draft = build_draft(config, files, kv, max_len) if config.speculative.draft_model is not None else None
    return ModelParts(files, backend, kv, max_len, draft)


def backend_config(config: AppConfig) -> BackendConfig:
    """[backend] with the decode graphs' largest bucket no larger than a step's sequences can be: buckets past
    scheduler.max_num_seqs would cost start-up time and memory and never replay."""
    most = min(config.backend.cuda_graph_max_batch, config.scheduler.max_num_seqs)
    return replace(config.backend, cuda_graph_max_batch=most)


def build_kv(config: AppConfig, backend: Backend, max_model_len: int) -> tuple[KVCacheManager, KVSpec]:
    """The KV pool for the backend's geometry: with sliding layers a paged pool can keep apart, theirs sized for
    max_num_seqs windows and a step's chunks; a pool too small for one sequence's window is refused in one line."""
    geo, sched = backend.kv_geometry, config.scheduler
    spec = KVSpec(geo.num_layers, geo.num_kv_heads, geo.head_dim, geo.dtype_bytes, config.kv.block_size,
                  window_layers=geo.window_layers, sliding_window=geo.sliding_window if geo.window_layers else 0)
    demand = StepDemand(sched.max_num_seqs, sched.max_num_batched_tokens)
    try:
        return kv_cache_manager_from_config(config.kv, spec, max_model_len, demand=demand), spec
    except ValueError as error:
        raise ConfigError(f"kv: {error}") from None


def log_kv(config: AppConfig, kv: KVCacheManager, spec: KVSpec) -> None:
    block, layout = config.kv.block_size, config.kv.kv_layout
    if not kv.window_blocks:
        log.info("KV cache: %d blocks of %d tokens (%d tokens, %.1f MiB at %d bytes a value, %s layout)",
                 kv.num_blocks, block, kv.num_blocks * block, kv.num_blocks * spec.bytes_per_block / 2**20,
                 spec.dtype_bytes, layout)
        return
    full_layers = spec.num_layers - spec.window_layers
    mib = spec.bytes_per_layer_block * (kv.num_blocks * full_layers + kv.window_blocks * spec.window_layers) / 2**20
    log.info("KV cache: %d blocks of %d tokens for the %d full-attention layers (%d tokens), %d blocks for the %d "
             "sliding layers' %d-position windows; %.1f MiB at %d bytes a value", kv.num_blocks, block, full_layers,
             kv.num_blocks * block, kv.window_blocks, spec.window_layers, spec.sliding_window, mib, spec.dtype_bytes)


def build_draft(config: AppConfig, files: ModelFiles, kv: KVCacheManager, max_model_len: int) -> DraftModel:
    """The draft model on the served model's backend, with a pool of as many blocks as the served model's (its
    KV is smaller, so it holds every running sequence); refused with one line when its tokenizer is not the
    served model's or its context is shorter."""
    path = config.speculative.draft_model
    assert path is not None
    _, draft_files = open_model(path)
    mismatch = vocabulary_mismatch(draft_files, files) or context_shortfall(draft_files, max_model_len)
    if mismatch:
        raise ConfigError(f"speculative.draft_model {path}: {mismatch}")
    backend = create_backend(replace(backend_config(config), model=path, chat_template=None), draft_files)
    pool = new_kv_cache_manager("paged", kv.num_blocks, kv.block_size, max_model_len=max_model_len,
                                enable_prefix_caching=False)
    backend.init_cache(pool.num_blocks, pool.block_size)
    log.info("draft model: %s, %d KV blocks of its own", path, pool.num_blocks)
    return DraftModel(backend, pool)


def vocabulary_mismatch(draft: ModelFiles, served: ModelFiles) -> str | None:
    """Why the draft's tokens are not the served model's (the same ids must be the same text), else None."""
    mine, theirs = draft.tokenizer.token_bytes, served.tokenizer.token_bytes
    if len(mine) != len(theirs):
        return f"its tokenizer has {len(mine)} tokens, the served model's {len(theirs)}"
    differ = next((i for i in range(len(mine)) if mine[i] != theirs[i]), None)
    if differ is not None:
        return f"its token {differ} is {mine[differ]!r}, the served model's {theirs[differ]!r}"
    if draft.tokenizer.eos_token_ids != served.tokenizer.eos_token_ids:
        return "its end-of-sequence tokens are not the served model's"
    return None


def context_shortfall(draft: ModelFiles, max_model_len: int) -> str | None:
    length = draft.config.context_length
    return f"its context ({length}) is shorter than max_model_len ({max_model_len})" if length < max_model_len else None


def build_engine(config: AppConfig, parts: ModelParts, observer: EngineObserver | None = None,
                 cost: StepCostModel | None = None, guides: GuideFactory | None = None) -> Engine:
    """The engine; the log says the ITL target its scheduler holds steps to (and where an "auto" one came
    from: it is resolved from `cost` as calibrated, so this is the first moment it is known)."""
    engine = Engine(config.scheduler, parts.kv, parts.backend, _tokenizer(parts),
                    max_model_len=parts.max_model_len, observer=observer,
                    step_timeout_s=config.service.step_timeout_s, cost=cost, guides=guides,
                    health=config.service.health, speculative=config.speculative, draft=parts.draft)
    log.info("ITL target: %s", engine.core.scheduler.itl_target.describe())
    return engine


def calibrated_cost(config: AppConfig, parts: ModelParts) -> StepCostModel:
    """The step-cost model, fitted on a second of warm-up steps when an ITL target will use it (blocking).
    A calibration that fails leaves the backend's guess, which serving then corrects: it is worth a warning,
    not a server that will not start."""
    cost = StepCostModel(parts.backend.cost_prior())
    # The simulator's guess is its own cost model already, and warm-up steps would use up its injected faults.
    if not config.scheduler.targets_itl or config.backend.name == "sim":
        return cost
    try:
        done = calibrate(config.scheduler, parts.kv, parts.backend, _tokenizer(parts), parts.max_model_len, cost)
    except Exception as exc:  # noqa: BLE001 - any failure: serve on the guess
        log.warning("step-cost calibration failed (%s: %s); the ITL target starts from the backend's guess",
                    type(exc).__name__, exc)
    else:
        fitted = ", ".join(f"{name} {value * 1e3:.4g} ms" for name, value in cost.named_coefficients)
        log.info("step-cost model calibrated on %d steps in %.1f s: per %s", done.steps, done.seconds, fitted)
    return cost


def backend_info(config: AppConfig, parts: ModelParts) -> Mapping[str, str]:
    """What runs the model, as /metrics' backend_info labels: the backend, and the CPU tier its C kernels were
    built for ("none" where none run: the NumPy kernels, or a backend of another kind)."""
    tier = getattr(parts.backend, "cpu_tier", None)  # the numpy backend's; the others build no CPU kernels
    return MappingProxyType({"backend": parts.backend.name, "cpu_isa": tier.name if tier is not None else "none",
                             "cpu_precision": config.backend.cpu_precision, "weights": config.backend.weights,
                             "kv_cache_dtype": config.backend.kv_cache_dtype})


def build_llm(config: AppConfig, parts: ModelParts) -> LLM:
    return LLM(config.scheduler, parts.kv, parts.backend, _tokenizer(parts), max_model_len=parts.max_model_len,
               speculative=config.speculative, draft=parts.draft)


def _tokenizer(parts: ModelParts) -> TokenizerLike:
    # TokenizerLike is a Protocol that the model's Tokenizer satisfies structurally; the cast only states it.
    return cast(TokenizerLike, parts.files.tokenizer)

