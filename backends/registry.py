"""Backend name -> factory. Factories import their backend lazily, so a CPU install never imports CuPy;
third-party backends register through the `pagedserve.backends` entry-point group."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from backends.base import Backend, BackendError
from backends.config import BackendConfig
from backends.model.loader import ModelFiles
from backends.numpy_backend.native.cpu_tiers import AUTO, CpuInfo, CpuTierError

Factory = Callable[[BackendConfig, ModelFiles], Backend]


def _numpy(config: BackendConfig, files: ModelFiles) -> Backend:
    from backends.model.loader import load_model  # noqa: PLC0415
    from backends.numpy_backend.backend import NumpyBackend  # noqa: PLC0415
    from backends.numpy_backend.native.weights import STORED_TYPES  # noqa: PLC0415

    stored = STORED_TYPES if config.weights == "gguf" else ()
    return NumpyBackend(load_model(stored=stored, files=files), config.cpu_kernels, config.cpu_precision,
                        config.kv_cache_dtype, config.cpu_isa)


def _cupy(config: BackendConfig, files: ModelFiles) -> Backend:
    from backends.cupy_backend import create  # noqa: PLC0415

    return create(config, files)


def _sim(config: BackendConfig, files: ModelFiles) -> Backend:
    from backends.sim_backend import create  # noqa: PLC0415

    return create(config, files)


BUILTIN: dict[str, Factory] = {"numpy": _numpy, "cupy": _cupy, "sim": _sim}


def available() -> dict[str, Factory]:
    factories = dict(BUILTIN)
    for ep in entry_points(group="pagedserve.backends"):
        factories.setdefault(ep.name, ep.load())
    return factories


def create_backend(config: BackendConfig, files: ModelFiles) -> Backend:
    check_backend(config)
    return available()[config.name](config, files)


def check_backend(config: BackendConfig) -> None:
    """What can be refused before the model loads: an unknown backend, and a CPU tier this CPU cannot run."""
    factories = available()
    if config.name not in factories:
        raise BackendError(f"unknown backend '{config.name}' (available: {', '.join(sorted(factories))})")
    if config.name == "numpy" and config.cpu_isa != AUTO:
        try:
            CpuInfo.of_this_host().choose(config.cpu_isa)
        except CpuTierError as exc:
            raise BackendError(str(exc)) from exc
