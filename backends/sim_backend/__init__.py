"""The `sim` backend: an engine step's tokens and timing without a model.

Tokens are deterministic pseudo-random ordinary tokens; step time comes from a roofline cost model of a
hardware profile ("zero", "cpu", "a100", "h100", "h200"), spent on a real clock (sleeping) or a virtual one
(simulated time, instant); the cost is the served model's, or that of a named bigger shape (`sim_model`).
"""

from __future__ import annotations

from backends.base import BackendError
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.sim_backend.backend import SimBackend
from backends.sim_backend.clock import Clock, RealClock, VirtualClock, make_clock
from backends.sim_backend.cost_model import CostModel, ModelShape, StepCost
from backends.sim_backend.faults import parse_faults
from backends.sim_backend.profiles import MODEL_SHAPES, PROFILES, HardwareProfile, get_profile, shaped
from backends.sim_backend.tokens import ordinary_token_ids

__all__ = [
    "MODEL_SHAPES", "PROFILES", "Clock", "CostModel", "HardwareProfile", "ModelShape", "RealClock", "SimBackend",
    "StepCost", "VirtualClock", "create", "get_profile", "make_clock",
]


def create(config: BackendConfig, files: ModelFiles) -> SimBackend:
    """The registry's factory: reads only the model's config and tokenizer, never its weights."""
    try:
        profile, clock = get_profile(config.sim_profile), make_clock(config.sim_clock)
        faults = parse_faults(config.sim_faults)
        model = shaped(files.config, config.sim_model)
    except ValueError as exc:
        raise BackendError(str(exc)) from None
    vocab = ordinary_token_ids(files.tokenizer, files.config)
    return SimBackend(model, vocab, profile, clock, seed=config.sim_seed, faults=faults)
