"""launch.py's geometry stays within what the kernels assume (no compilers needed)."""

from __future__ import annotations

import pytest

from backends.cupy_backend import launch


def test_names_are_unique_and_cover_every_dtype_and_head_dim() -> None:
    names = launch.all_kernel_names()
    quant = 5 * len(launch.QUANT_TYPES)  # GEMV and GEMM, each also to float32 logits; dequantize
    attention = (4 + 2 * len(launch.DECODE_BLOCK_SIZES)) * len(launch.HEAD_DIMS)  # and decode's per block size
    assert len(names) == len(set(names)) == 3 * (len(launch.ROW_KERNELS) + attention + quant)
    assert "paged_attention_decode_bf16_d128" in names and "rope_and_cache_f16" in names
    assert {"paged_prefill_attention_f16_d256", "gelu_tanh_mul_bf16", "silu_mul_f32", "head_rms_norm_f16"} <= set(names)
    assert {"quant_gemv_q4_1_bf16", "quant_gemv_logits_q8_0_f16", "dequantize_q4_0_f32"} <= set(names)
    assert {"quant_gemm_q6_k_f16", "quant_gemm_logits_q4_0_bf16"} <= set(names)


def test_quant_gemv_covers_every_column_with_whole_warps() -> None:
    per_block = launch.QUANT_GEMV_WARPS * launch.QUANT_GEMV_WARP_ROWS
    for n in (1, per_block - 1, per_block, 49152, 49153):
        spec = launch.quant_gemv("q4_1", "float16", 3, n, 576)
        assert spec.grid[0] * per_block >= n > (spec.grid[0] - 1) * per_block
        assert spec.block[0] == launch.QUANT_GEMV_WARPS * launch.WARP_SIZE
    assert launch.quant_gemv("q8_0", "bfloat16", 1, 8, 64, logits=True).name == "quant_gemv_logits_q8_0_bf16"


@pytest.mark.parametrize(("qtype", "rows", "k"), [("iq4_nl", 1, 256), ("q2_k", 1, 288), ("q3_k", 1, 32),
                                                  ("q4_0", 0, 64), ("q4_0", 9, 64), ("q8_0", 1, 48), ("q4_k", 1, 288),
                                                  ("q6_k", 1, 32), ("q5_0", 1, 80)])
def test_quant_launches_refuse_what_the_kernels_cannot_do(qtype: str, rows: int, k: int) -> None:
    with pytest.raises(ValueError):
        launch.quant_gemv(qtype, "float32", rows, 16, k)
    if rows == 1:
        with pytest.raises(ValueError):
            launch.dequantize(qtype, "float32", 3, k)
        with pytest.raises(ValueError):
            launch.quant_gemm(qtype, "float32", 65, 16, k)
    if rows == 0:
        with pytest.raises(ValueError):
            launch.quant_gemm(qtype, "float16", rows, 16, k)


def test_quant_gemm_tiles_cover_every_row_and_column() -> None:
    tile_rows, tile_cols = launch.QUANT_GEMM_TILE_ROWS, launch.QUANT_GEMM_TILE_COLS
    for rows, n in ((1, 1), (tile_rows, tile_cols), (tile_rows + 1, tile_cols - 1), (256, 49152), (9, 577)):
        spec = launch.quant_gemm("q4_1", "bfloat16", rows, n, 576)
        assert spec.grid[0] * tile_rows >= rows > (spec.grid[0] - 1) * tile_rows
        assert spec.grid[1] * tile_cols >= n > (spec.grid[1] - 1) * tile_cols
        assert spec.block == (launch.QUANT_GEMM_THREADS, 1, 1) and spec.name == "quant_gemm_q4_1_bf16"
    assert launch.quant_gemm("q6_k", "float32", 9, 8, 256, logits=True).name == "quant_gemm_logits_q6_k_f32"


def test_k_quants_take_rows_of_whole_super_blocks() -> None:
    assert launch.quant_gemv("q6_k", "float16", 1, 16, 768).name == "quant_gemv_q6_k_f16"
    assert launch.dequantize("q4_k", "bfloat16", 2, 256).name == "dequantize_q4_k_bf16"
    assert launch.quant_gemv("q2_k", "float32", 2, 16, 512).name == "quant_gemv_q2_k_f32"
    assert launch.dequantize("q3_k", "float16", 2, 256).name == "dequantize_q3_k_f16"
    assert launch.dequantize("q5_0", "float32", 2, 96).name == "dequantize_q5_0_f32"


@pytest.mark.parametrize("head_dim", launch.HEAD_DIMS)
def test_prefill_shared_memory_fits_the_default_48k_below_head_dim_256(head_dim: int) -> None:
    """head_dim 256 needs more (its launches opt in: launcher.py), within what an sm_80+ block may have."""
    spec = launch.paged_prefill_attention("float16", head_dim, 3, 8, 2, 37)
    assert spec.shared_mem <= (launch.DEFAULT_SHARED_MEM if head_dim < 256 else 99 * 1024)
    assert spec.grid == (8, 3, 3)


def test_the_default_block_size_has_decode_kernels_of_its_own() -> None:
    assert launch.paged_attention_decode("bfloat16", 64, 2, 9, 3, 16).name == "paged_attention_decode_bf16_d64_b16"
    assert launch.paged_attention_decode("bfloat16", 64, 2, 9, 3, 8).name == "paged_attention_decode_bf16_d64"
    spec = launch.paged_attention_decode_partitioned("float16", 256, 2, 4, 1, 1025, 512, 0, block_size=16)
    assert spec.name == "paged_attention_decode_partitioned_f16_d256_b16"
    names = set(launch.all_kernel_names())
    assert {f"paged_attention_decode{p}_{t}_d{d}_b16" for p in ("", "_partitioned") for t in ("f32", "f16", "bf16")
            for d in launch.HEAD_DIMS} <= names


def test_partitions_cover_the_longest_context() -> None:
    spec = launch.paged_attention_decode_partitioned("float32", 64, 2, 4, 4, 1025, 512)
    assert spec.grid == (4, 2, 3)
    assert launch.num_partitions(512, 512) == 1 and launch.num_partitions(0) == 1


def test_a_sliding_layer_partitions_its_window_only() -> None:
    assert launch.paged_attention_decode_partitioned("float32", 256, 2, 4, 1, 5000, 512, window=1024).grid[2] == 2
    assert launch.paged_attention_decode_partitioned("float32", 256, 2, 4, 1, 700, 512, window=1024).grid[2] == 2
    assert launch.attended_span(300, 1024) == 300 and launch.attended_span(5000, 0) == 5000


def test_row_kernels_use_whole_warps_up_to_the_cap() -> None:
    for hidden in (1, 31, 33, 200, 4096):
        threads = launch.rms_norm("bfloat16", 5, hidden).block[0]
        assert threads % launch.WARP_SIZE == 0 and threads <= launch.ROW_THREADS_MAX


def test_rejects_what_the_kernels_cannot_do() -> None:
    with pytest.raises(ValueError):
        launch.paged_attention_decode("float16", 96, 1, 8, 2)
    with pytest.raises(ValueError):
        launch.paged_attention_decode("float16", 64, 1, 8, 3)
    with pytest.raises(ValueError):
        launch.gated_activation("silu", "float64", 1, 8)
    with pytest.raises(ValueError):
        launch.gated_activation("relu", "float32", 1, 8)
    with pytest.raises(ValueError):
        launch.paged_attention_decode("float16", 512, 1, 8, 2)


def test_use_partitioned_only_for_long_contexts_on_small_grids() -> None:
    assert not launch.use_partitioned_decode(512, 1, 32)
    assert launch.use_partitioned_decode(4096, 1, 32)
    assert not launch.use_partitioned_decode(4096, 64, 32)
    assert launch.use_partitioned_decode(16384, 64, 32)
