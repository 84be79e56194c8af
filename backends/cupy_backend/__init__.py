"""The `cupy` backend: the Llama forward on a CUDA GPU with our own kernels (`kernels/*.cu`) and cuBLAS.

Importing this package never imports CuPy, so a CPU install can import it (and the registry can list it);
`create` imports CuPy and fails with one clear message naming the `cuda` extra when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.config import BackendConfig
    from backends.cupy_backend.backend import CupyBackend
    from backends.model.loader import ModelFiles

__all__ = ["create"]


def create(config: BackendConfig, files: ModelFiles) -> CupyBackend:
    """The registry's factory: compiles the kernels, loads the model and uploads it in config.dtype."""
    from backends.cupy_backend.backend import CupyBackend  # noqa: PLC0415 - keep the package import light
    from backends.cupy_backend.device import cupy_device  # noqa: PLC0415
    from backends.model.loader import load_model  # noqa: PLC0415

    device = cupy_device()  # first: without CuPy or a GPU, fail before spending time on the weights
    model = load_model(files.path)
    return CupyBackend(model.config, model.weights, device, dtype=config.dtype)
