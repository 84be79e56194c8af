"""The `cupy` backend: the Llama forward on a CUDA GPU with our own kernels (`kernels/*.cu`) and cuBLAS.

Importing this package never imports CuPy, so a CPU install can import it (and the registry can list it);
`create` imports CuPy and fails with one clear message naming the `cuda` extra when it is missing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.config import BackendConfig
    from backends.cupy_backend.backend import CupyBackend
    from backends.model.loader import ModelFiles

__all__ = ["create"]

log = logging.getLogger(__name__)


def create(config: BackendConfig, files: ModelFiles) -> CupyBackend:
    """The registry's factory: compiles the kernels, loads the model and uploads it. With `weights = gguf`,
    matrices of the types the kernels read (quant_weights.KERNEL_TYPES) stay as the file stores them;
    activations and the KV cache are config.dtype either way. Decode graphs as config.cuda_graphs says (eager:
    captured when the server sizes the cache, in init_cache)."""
    from backends.cupy_backend.backend import CupyBackend  # noqa: PLC0415 - keep the package import light
    from backends.cupy_backend.device import cupy_device  # noqa: PLC0415
    from backends.cupy_backend.graphs import GraphSettings  # noqa: PLC0415
    from backends.cupy_backend.quant_weights import stored_types  # noqa: PLC0415
    from backends.model.loader import load_model  # noqa: PLC0415

    device = cupy_device()  # first: without CuPy or a GPU, fail before spending time on the weights
    model = load_model(stored=stored_types() if config.weights == "gguf" else (), files=files)
    _report_dense_copies(model.weights.dequantized, config.dtype)
    graphs = GraphSettings(config.cuda_graphs, config.cuda_graph_max_batch)
    return CupyBackend(model.config, model.weights, device, dtype=config.dtype, graphs=graphs)


def _report_dense_copies(names: tuple[str, ...], dtype: str) -> None:
    """Says once, at start-up, which matrices had a type no kernel reads as stored."""
    if names:
        log.warning("%d weight matrices are dense %s copies, no kernel reading their stored type: %s", len(names),
                    dtype, ", ".join(names[:6]) + (", ..." if len(names) > 6 else ""))
