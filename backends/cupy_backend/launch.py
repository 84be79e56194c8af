"""Launch geometry and argument types of the CUDA kernels in `kernels/`.

Pure functions with no CUDA import, used by the CuPy backend and by the CPU emulation tests, so the grid a
kernel is written for is stated once. Each returns a `Launch`: the extern "C" symbol, grid, block, dynamic
shared memory bytes, and the argument types in order ('p' device pointer, 'i' int32, 'f' float32), which the
emulation checks against the kernel's real parameters. Argument order is documented on each function.

Layout preconditions (the kernels move 16-byte vectors): head_dim in HEAD_DIMS, every row stride of a
q/k/v view a multiple of 16 bytes, and the quantized GEMV's x contiguous (its width a whole number of blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32
HEAD_DIMS = (64, 128, 256)
DTYPE_SUFFIXES = (("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16"))
ATTENTION_THREADS = 128  # kThreads in paged_attention_decode.cu and paged_prefill_attention.cu
DEFAULT_PARTITION_SIZE = 512
PREFILL_Q_TILE = 16  # kQTile in paged_prefill_attention.cu
PREFILL_K_TILE = 32  # kKTile
DECODE_BLOCK_SIZES = (16,)  # KV block sizes the decode kernels are also compiled for (PS_DEFINE_DECODE's _b16)
ROW_THREADS_MAX = 256  # block size cap of the one-block-per-row kernels
# Dynamic shared memory a kernel gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize); the
# prefill kernel's head_dim 256 layout needs more, which the launcher asks for.
DEFAULT_SHARED_MEM = 48 * 1024
ACTIVATIONS = ("silu", "gelu_tanh")  # Architecture.activation: the gated MLP kernels, <activation>_mul_<dtype>
ROW_KERNELS = ("rope_and_cache", "rms_norm", "fused_add_rms_norm", "head_rms_norm",
               *(f"{a}_mul" for a in ACTIVATIONS))
# Weight blocks read as stored (kernels/quant_blocks.cuh, PS_FOR_EACH_QUANT): blocks of 32 weights, or the
# K-quants' super-blocks of 256, so a row's width is a whole number of them.
QUANT_TYPES = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k")
K_QUANT_TYPES = ("q4_k", "q5_k", "q6_k", "q2_k", "q3_k")
QUANT_BLOCK = 32  # a thread's unit is half of such a block (a K-quant super-block holds 8)
QUANT_SUPER_BLOCK = 256
QUANT_GEMV_WARPS = 4  # kWarps in quant_gemv.cu
QUANT_GEMV_WARP_ROWS = 2  # kWarpRows: rows of W per warp
QUANT_GEMV_MAX_ROWS = 8  # kMaxRows: rows of x one GEMV launch takes
QUANT_GEMM_TILE_ROWS = 64  # kTileRows in quant_gemm.cu: rows of x a block takes
QUANT_GEMM_TILE_COLS = 64  # kTileCols: columns of y (rows of W) a block takes
QUANT_GEMM_THREADS = 128  # kThreads


@dataclass(frozen=True)
class Launch:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    arg_types: str


def suffix(dtype: str) -> str:
    """'float16' -> 'f16': the dtype part of a kernel name."""
    for name, short in DTYPE_SUFFIXES:
        if dtype == name:
            return short
    raise ValueError(f"unsupported kernel dtype {dtype!r}; expected one of {[n for n, _ in DTYPE_SUFFIXES]}")


def _attention_name(base: str, dtype: str, head_dim: int) -> str:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} not compiled; kernels exist for {HEAD_DIMS}")
    return f"{base}_{suffix(dtype)}_d{head_dim}"


def _check_gqa(num_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")


def _row_block(work: int) -> tuple[int, int, int]:
    """Threads for a one-block-per-row kernel: enough warps for `work` items, at most ROW_THREADS_MAX."""
    warps = max(1, min(ROW_THREADS_MAX // WARP_SIZE, -(-work // WARP_SIZE)))
    return (warps * WARP_SIZE, 1, 1)


def rope_and_cache(dtype: str, num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
                   rot_dim: int) -> Launch:
    """Args: positions (int32), q, k, v, k_cache, v_cache, slot_mapping (int64), cos_sin_cache (float,
    (max_position, rot_dim)), rot_dim, num_heads, num_kv_heads, head_dim, q_stride, kv_stride, halves (1: NeoX's
    pairs (i, i + rot_dim / 2); 0: interleaved). q rotated in place; K rotated into the cache, V copied."""
    if rot_dim % 2 or rot_dim > head_dim:
        raise ValueError(f"rot_dim {rot_dim} must be even and at most head_dim {head_dim}")
    if head_dim % (4 if dtype == "float32" else 8):  # V moves in 16-byte vectors
        raise ValueError(f"head_dim {head_dim} is not a whole number of 16-byte vectors")
    work = max(num_heads * (rot_dim // 2), num_kv_heads * head_dim)
    return Launch(f"rope_and_cache_{suffix(dtype)}", (num_tokens, 1, 1), _row_block(work), 0, "ppppppppiiiiiii")


def num_partitions(max_context_len: int, partition_size: int = DEFAULT_PARTITION_SIZE) -> int:
    return max(1, -(-max_context_len // partition_size))


def attended_span(max_context_len: int, window: int) -> int:
    """The most positions one query attends to: the context, or a sliding layer's window of it (window > 0)."""
    return min(max_context_len, window) if window > 0 else max_context_len


def use_partitioned_decode(
    max_context_len: int, num_seqs: int, num_heads: int, partition_size: int = DEFAULT_PARTITION_SIZE
) -> bool:
    """Split long contexts when the plain grid would leave the GPU underfilled (few sequences x heads)
    or a single block would walk a very long context."""
    parts = num_partitions(max_context_len, partition_size)
    return parts > 1 and (max_context_len > 8192 or num_seqs * num_heads <= 512)


def _decode_name(base: str, dtype: str, head_dim: int, block_size: int) -> str:
    """The decode kernel compiled for `block_size` where there is one (DECODE_BLOCK_SIZES), else the general one."""
    tail = f"_b{block_size}" if block_size in DECODE_BLOCK_SIZES else ""
    return _attention_name(base, dtype, head_dim) + tail


def paged_attention_decode(dtype: str, head_dim: int, num_seqs: int, num_heads: int, num_kv_heads: int,
                           block_size: int = 0) -> Launch:
    """Args: out (seqs, heads, head_dim), q, k_cache, v_cache, block_tables, context_lens, scale (float),
    num_kv_heads, max_blocks_per_seq, block_size, q_stride, window (0: the whole context; else a sliding layer's
    last `window` positions, and none read before them). block_size: the KV pool's, which picks the kernel
    compiled for it (0: the general one)."""
    _check_gqa(num_heads, num_kv_heads)
    return Launch(
        _decode_name("paged_attention_decode", dtype, head_dim, block_size),
        (num_heads, num_seqs, 1),
        (ATTENTION_THREADS, 1, 1),
        0,
        "ppppppfiiiii",
    )


def paged_attention_decode_partitioned(
    dtype: str,
    head_dim: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    max_context_len: int,
    partition_size: int = DEFAULT_PARTITION_SIZE,
    window: int = 0,
    block_size: int = 0,
) -> Launch:
    """Args: exp_sums, max_logits (float, (seqs, heads, partitions)), tmp_out (float, (seqs, heads,
    partitions, head_dim)), q, k_cache, v_cache, block_tables, context_lens, scale (float), num_kv_heads,
    max_blocks_per_seq, block_size, q_stride, partition_size, window. Partitions = grid z = num_partitions()
    of the attended span: partition z starts z * partition_size after the window's first position."""
    _check_gqa(num_heads, num_kv_heads)
    parts = num_partitions(attended_span(max_context_len, window), partition_size)
    return Launch(
        _decode_name("paged_attention_decode_partitioned", dtype, head_dim, block_size),
        (num_heads, num_seqs, parts),
        (ATTENTION_THREADS, 1, 1),
        0,
        "ppppppppfiiiiii",
    )


def paged_attention_reduce(dtype: str, head_dim: int, num_seqs: int, num_heads: int) -> Launch:
    """Args: out, exp_sums, max_logits, tmp_out, context_lens, max_partitions, partition_size, window (the
    decode kernel's)."""
    return Launch(
        _attention_name("paged_attention_reduce", dtype, head_dim),
        (num_heads, num_seqs, 1),
        (head_dim, 1, 1),
        0,
        "pppppiii",
    )


def prefill_shared_mem(head_dim: int) -> int:
    """Bytes of the Smem<D> layout in paged_prefill_attention.cu: q tile, padded K tile, V tile, and per
    warp a score row and a probability row."""
    q, k, v = PREFILL_Q_TILE * head_dim, PREFILL_K_TILE * (head_dim + 1), PREFILL_K_TILE * head_dim
    rows = (ATTENTION_THREADS // WARP_SIZE) * 2 * PREFILL_K_TILE
    return 4 * (q + k + v + rows)


def paged_prefill_attention(
    dtype: str, head_dim: int, num_seqs: int, num_heads: int, num_kv_heads: int, max_query_len: int
) -> Launch:
    """Args: out (tokens, heads, head_dim), q, k_cache, v_cache, block_tables, context_lens, query_start
    (seqs + 1), scale (float), num_kv_heads, max_blocks_per_seq, block_size, q_stride, window (as the decode
    kernel's, for each query's own position)."""
    _check_gqa(num_heads, num_kv_heads)
    q_tiles = max(1, -(-max_query_len // PREFILL_Q_TILE))
    return Launch(
        _attention_name("paged_prefill_attention", dtype, head_dim),
        (num_heads, num_seqs, q_tiles),
        (ATTENTION_THREADS, 1, 1),
        prefill_shared_mem(head_dim),
        "pppppppfiiiii",
    )


def rms_norm(dtype: str, num_tokens: int, hidden: int) -> Launch:
    """Args: out, input, weight, eps (float), hidden. `out` may be `input`."""
    return Launch(f"rms_norm_{suffix(dtype)}", (num_tokens, 1, 1), _row_block(hidden), 0, "pppfi")


def fused_add_rms_norm(dtype: str, num_tokens: int, hidden: int) -> Launch:
    """Args: out, input, residual (updated to input + residual), weight, eps (float), hidden."""
    return Launch(f"fused_add_rms_norm_{suffix(dtype)}", (num_tokens, 1, 1), _row_block(hidden), 0, "ppppfi")


def head_rms_norm(dtype: str, num_tokens: int, num_heads: int, num_kv_heads: int) -> Launch:
    """QK norm, in place. Args: qkv (tokens, stride), q_weight (head_dim,), k_weight (head_dim,), eps (float),
    num_heads, head_dim, stride."""
    return Launch(f"head_rms_norm_{suffix(dtype)}", (num_tokens, num_heads + num_kv_heads, 1), (WARP_SIZE, 1, 1),
                  0, "pppfiii")


def gated_activation(activation: str, dtype: str, num_tokens: int, d: int) -> Launch:
    """act(gate) * up for an activation in ACTIVATIONS. Args: out (tokens, d), input (tokens, 2 * d), d."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"no kernel for activation {activation!r}; they exist for {ACTIVATIONS}")
    return Launch(f"{activation}_mul_{suffix(dtype)}", (num_tokens, 1, 1), _row_block(d), 0, "ppi")


def quant_row_multiple(qtype: str) -> int:
    """Weights per stored block of `qtype`: every row width is a multiple of it."""
    return QUANT_SUPER_BLOCK if qtype in K_QUANT_TYPES else QUANT_BLOCK


def _check_quant(qtype: str, k: int) -> None:
    if qtype not in QUANT_TYPES:
        raise ValueError(f"no kernels for weight type {qtype!r}; they exist for {QUANT_TYPES}")
    multiple = quant_row_multiple(qtype)
    if k <= 0 or k % multiple:
        raise ValueError(f"row width {k} is not a positive multiple of {multiple} ({qtype})")


def quant_gemv(qtype: str, dtype: str, rows: int, n: int, k: int, logits: bool = False) -> Launch:
    """y (rows, n) = x (rows, k) @ W.T with W stored as `qtype` blocks, for 1..QUANT_GEMV_MAX_ROWS rows.
    Args: y (storage dtype; float32 when `logits`), x (rows, k) contiguous, w (n, row bytes) uint8, rows, n, k."""
    _check_quant(qtype, k)
    if not 1 <= rows <= QUANT_GEMV_MAX_ROWS:
        raise ValueError(f"the GEMV takes 1 to {QUANT_GEMV_MAX_ROWS} rows, not {rows}")
    per_block = QUANT_GEMV_WARPS * QUANT_GEMV_WARP_ROWS
    base = "quant_gemv_logits" if logits else "quant_gemv"
    grid = (-(-n // per_block), 1, 1)
    return Launch(f"{base}_{qtype}_{suffix(dtype)}", grid, (QUANT_GEMV_WARPS * WARP_SIZE, 1, 1), 0, "pppiii")


def quant_gemm(qtype: str, dtype: str, rows: int, n: int, k: int, logits: bool = False) -> Launch:
    """y (rows, n) = x (rows, k) @ W.T with W stored as `qtype` blocks, for any number of rows (the GEMV's are
    faster up to QUANT_GEMV_MAX_ROWS). Args as quant_gemv's: y, x contiguous (16-byte aligned), w, rows, n, k."""
    _check_quant(qtype, k)
    if rows < 1:
        raise ValueError(f"the GEMM takes at least 1 row, not {rows}")
    grid = (-(-rows // QUANT_GEMM_TILE_ROWS), -(-n // QUANT_GEMM_TILE_COLS), 1)  # row tiles vary fastest
    base = "quant_gemm_logits" if logits else "quant_gemm"
    return Launch(f"{base}_{qtype}_{suffix(dtype)}", grid, (QUANT_GEMM_THREADS, 1, 1), 0, "pppiii")


def dequantize(qtype: str, dtype: str, num_rows: int, k: int) -> Launch:
    """Rows ids[i] of W (stored as `qtype` blocks) into out (num_rows, k) in the storage dtype.
    Args: out, w (rows, row bytes) uint8, ids (int32, num_rows), k."""
    _check_quant(qtype, k)
    halves = 2 * k // QUANT_BLOCK  # a thread's unit of work: half a block
    return Launch(f"dequantize_{qtype}_{suffix(dtype)}", (num_rows, 1, 1), _row_block(halves), 0, "pppi")


def _quant_names(short: str) -> list[str]:
    bases = ("quant_gemv", "quant_gemv_logits", "quant_gemm", "quant_gemm_logits", "dequantize")
    return [f"{base}_{qtype}_{short}" for base in bases for qtype in QUANT_TYPES]


def all_kernel_names() -> tuple[str, ...]:
    """Every exported kernel symbol, for loading modules and for checking the sources export them all."""
    names: list[str] = []
    for dtype, short in DTYPE_SUFFIXES:
        names += [f"{base}_{short}" for base in ROW_KERNELS]
        names += _quant_names(short)
        for head_dim in HEAD_DIMS:
            names += [
                _attention_name(base, dtype, head_dim)
                for base in (
                    "paged_attention_decode",
                    "paged_attention_decode_partitioned",
                    "paged_attention_reduce",
                    "paged_prefill_attention",
                )
            ]
            names += [_decode_name(base, dtype, head_dim, size) for size in DECODE_BLOCK_SIZES
                      for base in ("paged_attention_decode", "paged_attention_decode_partitioned")]
    return tuple(names)
