"""The CPU tiers the kernel tests run on: every tier this host can execute (cpu_tiers.py), each built from the
same source, so a machine with AMX also proves the AVX-512, AVX2 and generic paths; and what each tier's build
must report it runs, so a build that silently lost a path fails."""

from __future__ import annotations

from backends.numpy_backend.native.cpu_tiers import CpuInfo, CpuTier

HOST = CpuInfo.of_this_host()
RUNNABLE: tuple[CpuTier, ...] = HOST.runnable()

# Steps of 1-3 rows on Q4_0 / Q4_1 / Q5_0 / Q5_1 / K-quant weights in 8-bit integers (q8_dots.h, q8_k.h): AVX2's
# pmaddubsw, VNNI, NEON's sdot.
SMALL_STEPS = frozenset({"avx2", "avx512", "avx512-vnni", "amx", "neon"})
WIDE_SUMS = frozenset({"avx512", "avx512-vnni", "amx"})  # stored weights summed in 16 lanes (quant_wide.h)
# The 8-bit path for steps of 4-64 rows too, six rows of x at a time (q8_dots.h's Q8_CHUNK): AVX-512's registers
WIDE_STEPS = frozenset({"avx512", "avx512-vnni", "amx"})
# AVX-512 VNNI: Q8_0 and the K-quants with x in lanes from 8 rows, past 64 too (q8_lanes.h)
LANE_STEPS = frozenset({"avx512-vnni", "amx"})
# Q8_0 regrouped 16 rows at a time at load for the fast precision, any rows (q8_grouped.h, grouped_q8.py)
GROUPED_Q8 = frozenset({"avx512-vnni", "amx"})
TILES = frozenset({"amx"})  # bfloat16 products on AMX tiles, where the kernel may use them (fast_matmul.h)


def tier_id(tier: CpuTier) -> str:
    return tier.name
