"""Named emulation cases: each runs kernels through the emulation library and compares with the reference.

Context lengths are odd or end in partial blocks (block_size 16), block tables are shuffled, GQA ratios are
1, 3 and 8; the dequantizing kernels read random blocks of every type they know (checks_quant.py). Sliding-window
cases use windows shorter than most contexts, at head_dim 64 and 256 (Gemma 3's).
`tsan_cases` are small variants, one per kernel, for the ThreadSanitizer build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np

from backends.cupy_backend.launch import QUANT_TYPES
from tests.cuda import checks_attention as att
from tests.cuda import checks_elementwise as elem
from tests.cuda import checks_probe as probe
from tests.cuda import checks_quant as quant
from tests.cuda.dtypes import ALL, BFLOAT16, FLOAT16, FLOAT32, DType
from tests.cuda.emu_lib import EmuLib

Case = Callable[[EmuLib], None]
GQA_1, GQA_3, GQA_8 = att.Shape(heads=4, kv_heads=4), att.Shape(heads=6, kv_heads=2), att.Shape(heads=8, kv_heads=1)
DECODE_CONTEXTS = (1, 17, 33, 70, 5)
# (prefix, chunk) pairs: no prefix, a 1-token decode row, chunks across query tiles (16) and key tiles (32).
PREFILL_PREFIXES = (0, 13, 5, 40, 16)
PREFILL_CHUNKS = (23, 5, 1, 37, 16)
WINDOW = 20  # shorter than most contexts above, longer than some, not a multiple of the block size
D256 = att.Shape(heads=4, kv_heads=2, head_dim=256)
D256_WINDOW = att.Shape(heads=4, kv_heads=1, head_dim=256, window=WINDOW)
BLOCK8 = att.Shape(heads=6, kv_heads=2, block_size=8)


def check_conversions(lib: EmuLib, dt: DType) -> None:
    """The emulated float <-> 16-bit conversions round like NumPy (ties, subnormals, overflow, NaN)."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, 65504.0, 65519.9, 65520.0, 1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 6e-8, np.inf]
    x = np.concatenate([special, np.negative(special), rng.standard_normal(4096) * 10.0 ** rng.integers(-9, 6, 4096)])
    x = x.astype(np.float32)
    steps = np.arange(2048, dtype=np.uint32)
    # Exactly halfway between two neighbours: float16 (13 dropped bits) and bfloat16 (16 dropped bits).
    ties = np.concatenate([0x3F801000 + (steps << 13), 0x3F808000 + (steps << 16)]).view(np.float32)
    x = np.concatenate([x, ties, -ties, np.array([np.nan], np.float32)])
    short = "f16" if dt is FLOAT16 else "bf16"
    bits = lib.convert(f"f32_to_{short}", x)
    want = dt.encode(x).view(np.uint16)
    finite = ~np.isnan(x)
    assert np.array_equal(bits[finite], want[finite]), f"float32 -> {dt.name} rounding differs from NumPy"
    assert np.isnan(dt.decode(bits[~finite].view(dt.storage))).all(), "NaN must stay NaN"
    back = lib.convert(f"{short}_to_f32", bits)
    assert np.array_equal(back[finite], dt.decode(want[finite].view(dt.storage)).astype(np.float32))
    print(f"{dt.name} conversions: {x.size} values match")


def _dtype_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for dt in ALL:
        s = dt.name
        cases[f"rope_and_cache-{s}"] = partial(elem.check_rope_and_cache, dt=dt)
        cases[f"rope_and_cache-{s}-halves-d256"] = partial(elem.check_rope_and_cache, dt=dt, rot_dim=256,
                                                           head_dim=256, halves=True)
        cases[f"rms_norm-{s}"] = partial(elem.check_rms_norm, dt=dt)
        cases[f"fused_add_rms_norm-{s}"] = partial(elem.check_fused_add_rms_norm, dt=dt)
        cases[f"head_rms_norm-{s}"] = partial(elem.check_head_rms_norm, dt=dt)
        for activation in ("silu", "gelu_tanh"):
            cases[f"{activation}_mul-{s}"] = partial(elem.check_gated_activation, dt=dt, activation=activation)
        for qtype in QUANT_TYPES:
            cases[f"quant-{qtype}-{s}"] = partial(quant.check_quant, dt=dt, qtype=qtype)
        for ratio, shape in ((1, GQA_1), (3, GQA_3), (8, GQA_8)):
            cases[f"decode-{s}-gqa{ratio}"] = partial(
                att.check_decode, dt=dt, s=shape, context_lens=DECODE_CONTEXTS, seed=ratio
            )
            cases[f"prefill-{s}-gqa{ratio}"] = partial(
                att.check_prefill, dt=dt, s=shape, prefix_lens=PREFILL_PREFIXES, query_lens=PREFILL_CHUNKS
            )
        cases.update(_window_and_d256_cases(dt))
    return cases


def _window_and_d256_cases(dt: DType) -> dict[str, Case]:
    s, windowed = dt.name, att.Shape(heads=6, kv_heads=2, window=WINDOW)
    return {
        f"decode-{s}-window": partial(att.check_decode, dt=dt, s=windowed, context_lens=DECODE_CONTEXTS, seed=2),
        f"decode-parts16-{s}-window": partial(att.check_decode_partitioned, dt=dt, s=windowed,
                                              context_lens=(70, 0, 21, 37, 5), partition_size=16),
        f"prefill-{s}-window": partial(att.check_prefill, dt=dt, s=windowed, prefix_lens=PREFILL_PREFIXES,
                                       query_lens=PREFILL_CHUNKS),
        f"decode-{s}-d256": partial(att.check_decode, dt=dt, s=D256, context_lens=(45, 3, 64)),
        f"decode-{s}-d256-window": partial(att.check_decode, dt=dt, s=D256_WINDOW, context_lens=(45, 3, 64)),
        f"decode-parts16-{s}-d256-window": partial(att.check_decode_partitioned, dt=dt, s=D256_WINDOW,
                                                   context_lens=(45, 0, 64), partition_size=16),
        f"prefill-{s}-d256": partial(att.check_prefill, dt=dt, s=D256, prefix_lens=(7, 0), query_lens=(20, 33)),
        f"prefill-{s}-d256-window": partial(att.check_prefill, dt=dt, s=D256_WINDOW, prefix_lens=(40, 0, 3),
                                            query_lens=(5, 37, 1)),
    }


def _special_cases() -> dict[str, Case]:
    d128 = att.Shape(heads=4, kv_heads=2, head_dim=128)
    return {
        "probe-warp-intrinsics": probe.check_warp_intrinsics,
        "conversions-float16": partial(check_conversions, dt=FLOAT16),
        "conversions-bfloat16": partial(check_conversions, dt=BFLOAT16),
        "rope_and_cache-float16-partial": partial(elem.check_rope_and_cache, dt=FLOAT16, rot_dim=32),
        # The production partition size over contexts of 2 and 3 partitions; a padding row (context 0).
        "decode-parts512-float32-gqa3": partial(
            att.check_decode_partitioned, dt=FLOAT32, s=GQA_3, context_lens=(1100, 0, 513, 37), partition_size=512
        ),
        "decode-parts64-float16-gqa8": partial(
            att.check_decode_partitioned, dt=FLOAT16, s=GQA_8, context_lens=(200, 65, 3, 129), partition_size=64
        ),
        # A partition size that is not a multiple of the block size.
        "decode-parts40-bfloat16-gqa1": partial(
            att.check_decode_partitioned, dt=BFLOAT16, s=GQA_1, context_lens=(121, 40, 81), partition_size=40
        ),
        "decode-float16-d128": partial(att.check_decode, dt=FLOAT16, s=d128, context_lens=(45, 3, 64)),
        "prefill-bfloat16-d128": partial(
            att.check_prefill, dt=BFLOAT16, s=d128, prefix_lens=(7, 0), query_lens=(20, 33)
        ),
        "decode-empty-float32": partial(att.check_decode, dt=FLOAT32, s=GQA_3, context_lens=(0, 9)),
        # A block size without a kernel of its own (the others run the _b16 ones): the general kernels.
        "decode-float16-block8": partial(att.check_decode, dt=FLOAT16, s=BLOCK8, context_lens=DECODE_CONTEXTS),
        "decode-parts16-bfloat16-block8-window": partial(
            att.check_decode_partitioned, dt=BFLOAT16, s=replace(BLOCK8, window=WINDOW), context_lens=(70, 0, 21, 37),
            partition_size=16
        ),
    }


def _tsan_cases() -> dict[str, Case]:
    small = att.Shape(heads=6, kv_heads=2)
    return {
        "tsan-rope_and_cache": partial(elem.check_rope_and_cache, dt=FLOAT16, tokens=4),
        "tsan-rms_norm": partial(elem.check_rms_norm, dt=FLOAT32, tokens=2, hidden=96),
        "tsan-fused_add_rms_norm": partial(elem.check_fused_add_rms_norm, dt=BFLOAT16, tokens=2, hidden=96),
        "tsan-silu_mul": partial(elem.check_gated_activation, dt=BFLOAT16, tokens=2, d=96),
        "tsan-gelu_tanh_mul": partial(elem.check_gated_activation, dt=FLOAT16, activation="gelu_tanh", tokens=2, d=96),
        "tsan-head_rms_norm": partial(elem.check_head_rms_norm, dt=BFLOAT16, tokens=2, head_dim=64),
        "tsan-rope_and_cache-halves": partial(elem.check_rope_and_cache, dt=FLOAT32, tokens=4, halves=True),
        "tsan-quant_gemv": partial(quant.check_quant_gemv, dt=FLOAT16, qtype="q4_1", n=11, k=64),
        "tsan-quant_gemv-q5_k": partial(quant.check_quant_gemv, dt=BFLOAT16, qtype="q5_k", n=11, k=256),
        # 4 steps: each half of the double buffer refilled after the tensor cores read it
        "tsan-quant_gemm": partial(quant.check_quant_gemm, dt=BFLOAT16, qtype="q4_0", n=70, k=128, row_counts=(9,)),
        "tsan-quant_gemm-f32": partial(quant.check_quant_gemm, dt=FLOAT32, qtype="q6_k", n=11, k=256, row_counts=(9,)),
        "tsan-dequantize": partial(quant.check_dequantize, dt=BFLOAT16, qtype="q8_0"),
        "tsan-decode": partial(att.check_decode, dt=FLOAT16, s=small, context_lens=(37, 5)),
        "tsan-decode-partitioned": partial(
            att.check_decode_partitioned, dt=FLOAT32, s=small, context_lens=(70, 9), partition_size=32
        ),
        "tsan-prefill": partial(att.check_prefill, dt=BFLOAT16, s=small, prefix_lens=(20, 0), query_lens=(18, 3)),
        "tsan-decode-partitioned-window": partial(
            att.check_decode_partitioned, dt=BFLOAT16, s=att.Shape(heads=6, kv_heads=2, window=21),
            context_lens=(70, 9), partition_size=16
        ),
        "tsan-prefill-window": partial(att.check_prefill, dt=FLOAT16, s=att.Shape(heads=6, kv_heads=2, window=9),
                                       prefix_lens=(20, 0), query_lens=(18, 3)),
    }


def all_cases() -> dict[str, Case]:
    return {**_dtype_cases(), **_special_cases(), **_tsan_cases(), "probe-race": probe.run_race}


def tsan_cases() -> tuple[str, ...]:
    return tuple(_tsan_cases())


def plain_cases() -> tuple[str, ...]:
    return tuple({**_dtype_cases(), **_special_cases()})
