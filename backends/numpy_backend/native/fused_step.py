"""ctypes binding of fused_step.c: a whole small step (every layer) in one C call.

Used for steps of up to `max_rows` tokens: decode tokens and prefill chunks, each token a row that attends to
its sequence's cache up to its own position (a chunk's rows together; a sliding layer's rows to their window).
Larger steps run the per-layer path in model.py. The layer is the model's Architecture, handed to C as data:
its RoPE pairs and activation as flags, its optional norms as pointers, each layer's window and RoPE table."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from backends.model.architecture import unsupported_by
from backends.model.config import ModelConfig
from backends.model.quant import QuantMatrix
from backends.model.weights import LayerWeights, ModelWeights
from backends.numpy_backend.kv_cache import PagedKVCache
from backends.numpy_backend.native.arrays import c_array, is_c_array
from backends.numpy_backend.native.build import SOURCE_DIR, build_library
from backends.numpy_backend.native.cpu_tiers import CpuTier, host_tier
from backends.numpy_backend.native.kernels import MAX_GROUP, kv_half
from backends.numpy_backend.native.matmul import LANES, MAX_ROWS
from backends.numpy_backend.native.weights import CWeights, c_weights, readable

_I64, _P = ctypes.c_int64, ctypes.c_void_p
_ERRORS = {-1: "out of memory", -2: "unsupported model shape", -3: "context length outside its block table",
           -5: "KV slot or block outside the cache"}
STAGES = ("projections", "attention", "other")  # fused_step.c's TIME_* order
_NORMS = ("attn_norm", "ffn_norm")
_OPTIONAL_NORMS = ("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")  # None where the architecture has none
# Architecture.features that fused_step.c computes (scaled embeddings before the call): all of them today.
FEATURES = frozenset({"RoPE over head halves", "GeGLU", "scaled embeddings", "QK norm", "QKV biases",
                      "norms after attention and MLP", "sliding-window layers"})
# With every layer matrix kept as stored, steps of up to this many tokens run fused: its exact kernels prefill
# 512 tokens faster than the per-layer path, which writes a float32 copy of each matrix for BLAS first
# (docs/PERFORMANCE.md). With float32 matrices BLAS needs no copy, and steps past MAX_ROWS go to it.
STORED_MAX_ROWS = 512
_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


class _ModelShape(ctypes.Structure):
    _fields_ = [(name, _I64) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn",
                                          "block_size", "num_blocks", "window_blocks", "kv_half", "rope_halves",
                                          "gelu")] + [
        ("eps", ctypes.c_float)]


class _LayerRefs(ctypes.Structure):
    _fields_ = [(name, _P) for name in _NORMS] + [(name, CWeights) for name in _MATRICES] + [
        ("keys", _P), ("values", _P)] + [(name, _P) for name in _OPTIONAL_NORMS] + [("window", _I64),
                                                                                    ("local_rope", _I64)] + [
        ("qkv_bias", _P)]


class _StepRows(ctypes.Structure):
    _fields_ = [("rows", _I64), ("table_stride", _I64)] + [
        (name, _P) for name in ("cos", "sin", "slots", "block_tables", "context_lens", "seq_first", "local_cos",
                                "local_sin")] + [("window_stride", _I64), ("window_slots", _P), ("window_tables", _P)]


class NativeFusedStep:
    """`run(x, cache, ...)`: every layer of a small step on x (tokens, hidden) in place, writing the KV cache."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, max_rows: int | None = None,
                 cache_dir: Path | None = None, fast: bool = False, tier: CpuTier | None = None) -> None:
        """fast: the projections in the fast precision (fast_matmul.h), else exact. max_rows: the most tokens a
        step may have (None: STORED_MAX_ROWS when every layer matrix is kept as stored, else MAX_ROWS). tier: the
        CPU tier to build for (cpu_tiers.py); None: the highest this CPU runs."""
        self.tier = tier or host_tier()
        self.library_path = build_library(SOURCE_DIR / "fused_step.c", self.tier, cache_dir)
        self._fn = ctypes.CDLL(str(self.library_path)).fused_step_f32
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_P, _P, _P, _P, _P, ctypes.c_int]
        stored = all(isinstance(getattr(layer, name), QuantMatrix) for layer in weights.layers for name in _MATRICES)
        self.max_rows = max_rows if max_rows is not None else STORED_MAX_ROWS if stored else MAX_ROWS
        self.config, self.weights, self.fast = config, weights, fast
        self.last_seconds = np.zeros(len(STAGES))  # the last step's time by stage (STAGES), filled by C
        # the cache arrays the pointers were taken from (kept alive), the shape and the pointers
        self._bound: tuple[tuple[np.ndarray, ...], _ModelShape, ctypes.Array[_LayerRefs]] | None = None

    @staticmethod
    def supports(config: ModelConfig, weights: ModelWeights) -> bool:
        """The architecture's features (FEATURES), the model's shape, and every layer matrix readable by the
        projections as it is kept."""
        return (not unsupported_by(config.arch, FEATURES) and config.head_dim % LANES == 0
                and config.hidden_size % LANES == 0 and config.intermediate_size % LANES == 0
                and config.num_heads % config.num_kv_heads == 0
                and config.num_heads // config.num_kv_heads <= MAX_GROUP
                and all(readable(getattr(layer, name)) for layer in weights.layers for name in _MATRICES))

    def fits(self, rows: int) -> bool:
        return 0 < rows <= self.max_rows

    def run(self, x: np.ndarray, cache: PagedKVCache, cos: np.ndarray, sin: np.ndarray, slots: np.ndarray,
            block_tables: np.ndarray, context_lens: np.ndarray, seq_first: np.ndarray | None = None,
            local_angles: tuple[np.ndarray, np.ndarray] | None = None,
            window: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """x (rows, hidden) float32: token embeddings (scaled where the architecture scales them) in, final
        hidden states out. Per row (token): cos, sin (rows, head_dim/2) the angles of its position at rope_theta,
        its KV slot, its sequence's block table, how many tokens it attends to (its position + 1), and the first
        row of its sequence (None: each row its own), so that a chunk's rows, consecutive positions of one
        sequence, attend together. local_angles: cos, sin at the sliding layers' RoPE base, where a layer's base
        is not rope_theta. window: each row's slot (rows,) and its sequence's table (rows, W) in the window pool,
        which the sliding layers use where the cache keeps them there (its window_layers); None: no window pool."""
        _require(x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable
                 and x.shape == (x.shape[0], self.config.hidden_size), "x must be (rows, hidden) writable float32")
        shape, layers = self._bind(cache)
        keep = [c_array(cos, np.float32), c_array(sin, np.float32), c_array(slots, np.int64),
                c_array(block_tables, np.int32), c_array(context_lens, np.int32)]  # alive until the call returns
        angles = (len(x), self.config.head_dim // 2)
        _require(keep[0].shape == angles == keep[1].shape and keep[2].shape == (len(x),) == keep[4].shape
                 and keep[3].ndim == 2 and len(keep[3]) == len(x),
                 "one row each of cos and sin (head_dim / 2 wide), slots, tables and lengths")
        firsts = None if seq_first is None else c_array(seq_first, np.int32)  # alive until the call returns
        _require(firsts is None or firsts.shape == (len(x),), "one sequence start per row")
        local = self._local_angles(local_angles, keep[0].shape)  # alive until the call returns
        rows = _StepRows(len(x), keep[3].shape[1], *(a.ctypes.data for a in keep),
                         None if firsts is None else firsts.ctypes.data, *(a.ctypes.data for a in local))
        window_refs = self._window_refs(window, cache, len(x))  # alive until the call returns
        if window_refs:
            rows.window_stride = window_refs[1].shape[1]
            rows.window_slots, rows.window_tables = (a.ctypes.data for a in window_refs)
        status = self._fn(ctypes.byref(shape), layers, ctypes.byref(rows), x.ctypes.data,
                          self.last_seconds.ctypes.data, int(self.fast))
        if status != 0:
            raise (MemoryError if status == -1 else ValueError)(f"native fused step: {_ERRORS.get(status, status)}")

    def _local_angles(self, angles: tuple[np.ndarray, np.ndarray] | None,
                      shape: tuple[int, ...]) -> list[np.ndarray]:
        """The local RoPE tables as C reads them; none where no layer uses them."""
        if not any(self._local_rope(i) for i in range(self.config.num_layers)):
            return []
        _require(angles is not None, "the sliding layers' RoPE angles are missing")
        assert angles is not None
        local = [c_array(a, np.float32) for a in angles]
        _require(all(a.shape == shape for a in local), "local angles shaped as cos and sin")
        return local

    def _window_refs(self, window: tuple[np.ndarray, np.ndarray] | None, cache: PagedKVCache,
                     rows: int) -> list[np.ndarray]:
        """The window pool's slots and tables as C reads them; none where the cache has no window pool."""
        _require((window is not None) == bool(cache.window_layers),
                 "window slots and tables go with a cache that has a window pool, and only with one")
        if window is None:
            return []
        refs = [c_array(window[0], np.int64), c_array(window[1], np.int32)]
        _require(refs[0].shape == (rows,) and refs[1].ndim == 2 and len(refs[1]) == rows,
                 "one row each of window slots and window tables")
        return refs

    def _local_rope(self, layer: int) -> bool:
        return self.config.layer_rope_base(layer) != self.config.rope_theta

    def _bind(self, cache: PagedKVCache) -> tuple[_ModelShape, ctypes.Array[_LayerRefs]]:
        """The model shape and per-layer pointers for the cache's arrays, built again whenever any of them is
        not the array the pointers were taken from (C would write into freed memory)."""
        arrays = (*cache.keys, *cache.values)
        if self._bound is None or len(arrays) != len(self._bound[0]) or any(
                a is not b for a, b in zip(arrays, self._bound[0], strict=True)):
            self._bound = (arrays, self._shape(cache), self._layer_refs(cache))
        return self._bound[1], self._bound[2]

    def _shape(self, cache: PagedKVCache) -> _ModelShape:
        c = self.config
        sliding = {i for i in range(c.num_layers) if c.layer_window(i) > 0}
        # C takes a layer with a window to be in the window pool whenever the step brings window tables
        _require(not cache.window_layers or cache.window_layers == sliding,
                 "the cache's window pool must hold exactly the sliding layers")
        return _ModelShape(c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                           c.intermediate_size, cache.block_size, cache.num_blocks, cache.window_blocks,
                           kv_half(*cache.keys, *cache.values), c.arch.rope_pairs == "halves",
                           c.arch.activation == "gelu_tanh", c.rms_eps)

    def _layer_refs(self, cache: PagedKVCache) -> ctypes.Array[_LayerRefs]:
        refs = (_LayerRefs * self.config.num_layers)()
        for i, layer in enumerate(self.weights.layers):
            arrays = [getattr(layer, name) for name in _NORMS] + [cache.keys[i], cache.values[i]]
            matrices = [getattr(layer, name) for name in _MATRICES]
            _require(all(is_c_array(a, np.float32) for a in arrays[:2]) and all(readable(w) for w in matrices),
                     f"layer {i}: norms must be C-contiguous float32, matrices of a readable type")
            refs[i] = _LayerRefs(*(a.ctypes.data for a in arrays[:2]), *(c_weights(w) for w in matrices),
                                 *(a.ctypes.data for a in arrays[2:]), *self._optional_norms(i, layer),
                                 self.config.layer_window(i), self._local_rope(i), self._qkv_bias(i, layer))
        return refs

    def _qkv_bias(self, index: int, layer: LayerWeights) -> int | None:
        bias = layer.qkv_bias
        _require(bias is None or (is_c_array(bias, np.float32) and bias.shape == (self.config.qkv_width,)),
                 f"layer {index}: QKV biases must be C-contiguous float32 of the Q, K and V widths")
        return None if bias is None else bias.ctypes.data

    def _optional_norms(self, index: int, layer: LayerWeights) -> list[int | None]:
        """The addresses of the layer's QK and sandwich norms, None where it has none."""
        c = self.config
        widths = (c.head_dim, c.head_dim, c.hidden_size, c.hidden_size)
        norms = [getattr(layer, name) for name in _OPTIONAL_NORMS]
        _require(all(n is None or (is_c_array(n, np.float32) and n.shape == (width,))
                     for n, width in zip(norms, widths, strict=True)),
                 f"layer {index}: QK and sandwich norms must be C-contiguous float32 of head_dim and hidden")
        return [None if n is None else n.ctypes.data for n in norms]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"native fused step: {message}")
