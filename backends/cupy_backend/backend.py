"""The CuPy backend: executes a StepBatch with our CUDA kernels and cuBLAS GEMMs, sampling on the device.

Per step: the batch's arrays go to the device in a few transfers, copy-on-write block copies run on the
device, the forward writes the step's K/V and attends, logits are computed only for the sampled rows, and
only the sampled ids (and logprobs when asked) come back to the host. A pure decode step replays its
batch-size bucket's CUDA graphs instead, when they are on (graphs.py).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.base import BackendError, Clock, KVGeometry, SamplingInputs, StepBatch, StepOutput
from backends.cupy_backend import launch
from backends.cupy_backend.decode_policy import load_policy
from backends.cupy_backend.device import Device
from backends.cupy_backend.device_model import DeviceKVCache, upload_weights
from backends.cupy_backend.forward import Forward
from backends.cupy_backend.gemm import Gemm, choose_gemm
from backends.cupy_backend.graph_sampling import graphable_sampling
from backends.cupy_backend.graphs import DecodeGraphs, GraphSettings
from backends.cupy_backend.ops import Kernels
from backends.cupy_backend.projections import Projections
from backends.cupy_backend.quant_ops import QuantKernels
from backends.cupy_backend.step_inputs import DeviceStep, upload_sampling, upload_step
from backends.cupy_backend.storage import storage_for
from backends.model.quant import QuantMatrix
from backends.sampling import SampleResult, sample
from backends.step_shape import CostCoefficients, ModelShape

if TYPE_CHECKING:
    from backends.model.config import ModelConfig
    from backends.model.weights import ModelWeights

log = logging.getLogger(__name__)

# What the forward computes beyond Llama's layer (ModelConfig.features' words): every feature the NumPy forward
# computes. A model with any other is refused at start-up.
SUPPORTED_FEATURES = frozenset({
    "RoPE over head halves", "GeGLU", "scaled embeddings", "QK norm", "QKV biases",
    "norms after attention and MLP", "sliding-window layers", "RoPE frequency factors",
})


class CupyBackend:
    name = "cupy"
    clock: Clock | None = None  # wall time
    step_is_instant = False  # a step waits on the device: off the event loop

    def __init__(self, config: ModelConfig, weights: ModelWeights, device: Device, dtype: str = "float32",
                 partition_size: int = launch.DEFAULT_PARTITION_SIZE, gemm: Gemm | None = None,
                 graphs: GraphSettings | None = None) -> None:
        _check_supported(config)
        _check_shared_memory(config, device)
        self.config, self.device = config, device
        self.graph_settings = graphs if graphs is not None else GraphSettings()  # default: off
        self.storage = storage_for(dtype)
        self.gemm = gemm if gemm is not None else choose_gemm(device.xp, self.storage)
        self.weights = upload_weights(device.xp, self.storage, config, weights)
        self.quantized = any(isinstance(m, QuantMatrix) for layer in weights.layers for m in vars(layer).values())
        policy = load_policy()
        log.info("decode attention: plain or partitioned by %s", policy.describe())
        kernels = Kernels(device.xp, device.launcher, self.storage, partition_size, policy=policy)
        proj = Projections(self.gemm, QuantKernels(device.xp, device.launcher, self.storage))
        self.forward = Forward(config, self.weights, kernels, proj)
        self._cache: DeviceKVCache | None = None
        self.graphs: DecodeGraphs | None = None  # made with the cache: graphs read it where they were captured

    def cost_prior(self) -> CostCoefficients:
        """A first guess at step times for a datacenter GPU driven from Python (1 TB/s, 100 TFLOP/s, 5 ms of
        launches a step: measured on an H200, a small model's step is launch-bound), cautious on purpose; the
        server's warm-up calibration and then every served step correct it."""
        shape, itemsize = ModelShape.of(self.config), self.storage.itemsize
        kv_bytes, dense = shape.kv_elements_per_token * itemsize, shape.streamed_params * itemsize
        # stored quantized weights: past the GEMV's rows the dequantizing GEMM dequantizes every block again for
        # each 64 rows; priced as the dense copy it replaced (twice the dense bytes) until a device measures it
        return CostCoefficients.roofline(shape, dense, kv_bytes, bandwidth=1e12, flops=100e12, overhead_s=5e-3,
                                         large_s=2 * dense / 1e12 if self.quantized else 0.0,
                                         large_above=launch.QUANT_GEMV_MAX_ROWS if self.quantized else 0)

    @property
    def kv_geometry(self) -> KVGeometry:
        cfg = self.config
        return KVGeometry(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype_bytes=self.storage.itemsize,
                          sliding_window=cfg.sliding_window, window_layers=len(self._sliding_layers()))

    def _sliding_layers(self) -> list[int]:
        return [i for i in range(self.config.num_layers) if self.config.layer_window(i) > 0]

    @property
    def cache(self) -> DeviceKVCache:
        if self._cache is None:
            raise RuntimeError("init_cache() must be called before the first step")
        return self._cache

    def init_cache(self, num_blocks: int, block_size: int, window_blocks: int = 0) -> None:
        """window_blocks > 0: the sliding layers' K/V in a pool of that many blocks of their own."""
        geo, sliding = self.kv_geometry, self._sliding_layers()
        if window_blocks > 0 and not sliding:
            raise BackendError(f"a window pool of {window_blocks} blocks for a model without sliding layers")
        self._cache, self.graphs = None, None  # free the old cache (and graphs reading it) before the new one
        self._cache = DeviceKVCache(self.device.xp, self.storage, geo.num_layers, num_blocks, block_size,
                                    geo.num_kv_heads, geo.head_dim, sliding, window_blocks)
        self.graphs = self._new_graphs(num_blocks, block_size)

    def _new_graphs(self, num_blocks: int, block_size: int) -> DecodeGraphs | None:
        """The decode graphs for the new cache, every bucket captured now in `eager` mode; None when off."""
        settings = self.graph_settings
        if settings.mode == "off":
            return None
        if self.device.graphs is None:
            log.warning("device %s captures no CUDA graphs: decode steps run eagerly", self.device.name)
            return None
        max_blocks = min(num_blocks, -(-self.config.context_length // block_size))
        graphs = DecodeGraphs(settings, self.device, self._forward_logits, max_blocks, block_size,
                              window_pool=bool(self.cache.window_layers))
        if settings.mode == "eager":
            graphs.capture_all()
        return graphs

    def _forward_logits(self, step: DeviceStep) -> Any:
        x, residual = self.forward.hidden_states(step, self.cache)
        return self.forward.logits(step, x, residual)

    def device_logits(self, batch: StepBatch, want_logits: bool = True) -> Any:
        """Runs the step's forward eagerly (writing its K/V); returns the (S, vocab) float32 device logits of
        batch.sample_rows, or None when there is nothing to sample or they are not wanted."""
        self._check_positions(batch)
        self.cache.check_window_inputs(batch)  # before the copies: a refused step changes nothing
        step = upload_step(self.device.xp, batch)
        self.cache.copy_blocks(batch.block_copies, batch.window_block_copies)
        if step.num_tokens == 0:
            return None
        x, residual = self.forward.hidden_states(step, self.cache)
        if not want_logits or batch.sample_rows.size == 0:
            return None
        return self.forward.logits(step, x, residual)

    def graph_logits(self, batch: StepBatch, bucket: int) -> Any:
        """device_logits through the bucket's decode graph (a step graphs.DecodeGraphs.bucket gave `bucket`)."""
        assert self.graphs is not None
        self._check_positions(batch)
        self.cache.check_window_inputs(batch)
        self.cache.copy_blocks(batch.block_copies, batch.window_block_copies)
        return self.graphs.forward(batch, bucket)

    def _check_positions(self, batch: StepBatch) -> None:
        if batch.num_tokens and int(batch.positions.max()) >= self.config.context_length:
            raise BackendError(f"position {int(batch.positions.max())} is past the model's context length "
                               f"{self.config.context_length}")

    def compute_logits(self, batch: StepBatch) -> np.ndarray:
        """(S, vocab) float32 host logits for batch.sample_rows: for tests and benchmarks (copies them all)."""
        logits = self.device_logits(batch)
        if logits is None:
            return np.zeros((0, self.config.vocab_size), np.float32)
        return np.asarray(self.device.to_host(logits), dtype=np.float32)

    def execute(self, batch: StepBatch) -> StepOutput:
        start = time.perf_counter()
        bucket = self.graphs.bucket(batch) if self.graphs is not None else None
        if bucket is None:
            logits = self.device_logits(batch, want_logits=batch.sampling is not None)
        else:
            logits = self.graph_logits(batch, bucket)
        self.device.synchronize()  # so "forward" is the GPU's time, not the launches'
        forward_done = time.perf_counter()
        if batch.sampling is None or logits is None:  # nothing to sample (a step of prefill chunks only)
            return StepOutput(np.zeros(0, np.int64), timings={"forward": forward_done - start})
        out = self._to_host(self._sample(logits, batch.sampling, bucket))
        out.timings.update({"forward": forward_done - start, "sample": time.perf_counter() - forward_done})
        return out

    def _sample(self, logits: Any, params: SamplingInputs, bucket: int | None) -> SampleResult:
        """In the bucket's sampling graph when there is one and the options allow; else eagerly."""
        if bucket is not None and self.graphs is not None and graphable_sampling(params):
            return self.graphs.sample(bucket, params)
        return sample(self.device.xp, logits, upload_sampling(self.device.xp, params))

    def _to_host(self, r: SampleResult) -> StepOutput:
        """Only the S sampled values (and top-k logprobs when asked) cross to the host."""
        host = self.device.to_host

        def opt(a: Any) -> Any:
            return None if a is None else host(a)

        return StepOutput(np.asarray(host(r.token_ids), np.int64), opt(r.logprobs), opt(r.top_token_ids),
                          opt(r.top_logprobs))


def _check_shared_memory(config: ModelConfig, device: Device) -> None:
    """The prefill attention kernel's tiles at this head_dim must fit the shared memory a kernel may opt into
    (head_dim 256 needs 82 KB: compute capability 7.0 or newer), refused at start-up rather than at the first
    prompt."""
    needed = launch.prefill_shared_mem(config.head_dim)
    if 0 < device.shared_mem_per_block < needed:
        raise BackendError(f"{device.name} gives a kernel at most {device.shared_mem_per_block // 1024} KB of "
                           f"shared memory; the prefill attention at head_dim {config.head_dim} needs "
                           f"{-(-needed // 1024)} KB ({config.name}); use --backend numpy")


def _check_supported(config: ModelConfig, supported: frozenset[str] = SUPPORTED_FEATURES) -> None:
    """The kernels exist for a few head sizes and need whole 16-byte rows, and compute the features in
    `supported`: refuse other models up front, in one line."""
    missing = [f for f in config.features if f not in supported]  # the family's and the model's own
    if missing:
        raise BackendError(f"the cupy backend does not compute {config.architecture}'s "
                           f"{', '.join(missing)} ({config.name}); use --backend numpy")
    if config.head_dim not in launch.HEAD_DIMS:
        raise BackendError(f"the cupy backend's attention kernels support head_dim {launch.HEAD_DIMS}, "
                           f"not {config.head_dim} ({config.name})")
    if config.num_heads % config.num_kv_heads:
        raise BackendError(f"num_heads {config.num_heads} is not a multiple of num_kv_heads {config.num_kv_heads}")
